"""A traced backward megakernel launch (its diagnostic kernel, which
benchmarks/diagnostics/trace_backward.py reads) gives the production kernel's outputs bit for
bit, and its stamps are consistent (gpu_checks.check_backward_trace_stamps), every tile
handed out traced exactly once: saved inputs, recomputed ones through the ring of one-m-block
macrobatches (every dW part carried), and the FP8 recipes' launches with rounding tiles."""

import pytest

import gpu_checks
from mok_megatron.cuda import ops
from test_backward_megakernel import MEGAKERNEL_PATH, RING, RING_ONE_MBLOCK
from test_symm_moe import SPECS

pytestmark = pytest.mark.gpu

SETTINGS = {"saved": MEGAKERNEL_PATH, "ring_one_mblock": RING_ONE_MBLOCK,
            "mxfp8": {**RING, "precision": "mxfp8"},
            "fp8_blockwise": {**RING, "precision": "fp8_blockwise"}}


@pytest.mark.parametrize("setting", SETTINGS)
def test_traced_launch_same_bits_and_ordered_stamps(setting, monkeypatch):
    spec = SPECS[1]
    problem = spec.build()
    max_tokens = max(spec.tokens_per_rank)
    knobs = SETTINGS[setting]
    expected = gpu_checks.run_cuda(problem, 0, None, max_tokens, **knobs)
    trace = ops.backward_trace_buffer("cuda")
    traced = gpu_checks.run_cuda_traced(monkeypatch, "moe_backward_megakernel", trace, problem,
                                        max_tokens, **knobs)
    gpu_checks.assert_same_bits(expected, traced, f"({spec.name}, {setting}) traced against "
                                "untraced")
    seen = gpu_checks.check_backward_trace_stamps(trace.cpu())
    assert sorted(seen) == list(range(len(seen))), "a tile traced twice or not at all"
