"""The backward megakernel (kernel.backward_kernel: megakernel) on one GPU: EP=1 and the
emulated EP=2/4 group. dx, dprobs, dW1, dW2 (and y) against the reference on uniform, skewed
and adversarial routings, experts without rows, F and H not multiples of the tile, outputs
poisoned first; bit-identical over runs, across numbers of dY-pulling blocks and minibatches,
saved against recomputed backward inputs; CUDA-graph replay with new inputs."""

import pytest
import torch

import gpu_checks
from mok_megatron import ops
from mok_megatron.testing import ProblemSpec
from test_symm_moe import SPECS

pytestmark = pytest.mark.gpu

BACKWARD = {"backward_kernel": "megakernel", "comm_sms_backward": 8}
MEGAKERNEL_PATH = {**BACKWARD, "forward_kernel": "megakernel", "comm_sms_forward": 8}
RING = {**MEGAKERNEL_PATH, "backward_inputs": "recomputed", "macrobatch_tokens": 256}
SETTINGS = {"megakernel_path": MEGAKERNEL_PATH, "separate_forward": BACKWARD, "ring": RING}

# Sizes off every tile edge: H and F multiples of 8 only (FC2-dgrad tiles are 128 columns
# of F, FC1-dgrad and wgrad tiles 256 columns, wgrad reductions 64 rows at a time), and top-1
# routing whose experts end mid-k-block.
ODD_SPECS = [
    ProblemSpec("odd_sizes", (700,), num_experts=6, hidden=200, ffn=104, topk=3,
                dtype=torch.bfloat16, probs_dtype=torch.float32, routing="zipf", seed=7),
    ProblemSpec("odd_top1", (333,), num_experts=5, hidden=328, ffn=136, topk=1,
                dtype=torch.bfloat16, probs_dtype=torch.float32, routing="zipf", seed=8),
    ProblemSpec("odd_relu", (300,), num_experts=3, hidden=136, ffn=264, topk=2,
                dtype=torch.bfloat16, probs_dtype=torch.float32, activation="squared_relu",
                seed=9),
]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("spec", SPECS + ODD_SPECS, ids=lambda s: s.name)
def test_matches_reference_and_is_deterministic(spec, setting):
    errors = gpu_checks.check_against_reference(spec, 0, None, **SETTINGS[setting])
    print(spec.name, setting, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("spec", SPECS[:3] + ODD_SPECS[:1], ids=lambda s: s.name)
def test_bit_identical_across_settings_and_inputs(spec):
    """Pulling blocks, minibatches and saved vs recomputed inputs change who does the work
    and when, never the bits; reported, not asserted: whether the separate backward (another
    dprob summation order) gives the same bits."""
    problem = spec.build()
    max_tokens = max(spec.tokens_per_rank)
    settings = [MEGAKERNEL_PATH, {**MEGAKERNEL_PATH, "comm_sms_backward": 1},
                {**MEGAKERNEL_PATH, "comm_sms_backward": 32, "minibatch_tokens": 37},
                {**MEGAKERNEL_PATH, "backward_inputs": "recomputed"}, RING]
    runs = [gpu_checks.run_cuda(problem, 0, None, max_tokens, **k) for k in settings]
    for knobs, run in zip(settings[1:], runs[1:]):
        gpu_checks.assert_same_bits(runs[0], run, f"({spec.name}) between {settings[0]} and "
                                    f"{knobs}")
    separate = gpu_checks.run_cuda(problem, 0, None, max_tokens, forward_kernel="megakernel")
    print(spec.name, "megakernel backward == separate bitwise:",
          {n: torch.equal(runs[0][n], separate[n]) for n in gpu_checks.NAMES})


@pytest.mark.parametrize("setting", ["megakernel_path", "ring"])
def test_cuda_graph_replay(setting):
    gpu_checks.check_cuda_graph(SPECS[1], 0, None, **SETTINGS[setting])


NAMES = [s.name for s in gpu_checks.ep_specs(2)]


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
@pytest.mark.parametrize("world", [2, 4])
def test_emulated_group_matches_reference(world, index):
    spec = gpu_checks.ep_specs(world)[index]
    errors = gpu_checks.check_emulated_against_reference(spec, **MEGAKERNEL_PATH)
    print(f"EP={world}", spec.name, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("world", [2, 4])
def test_emulated_group_bit_identical_across_settings(world):
    spec = gpu_checks.ep_specs(world)[3]  # ragged, one rank without tokens
    gpu_checks.check_emulated_settings(spec, [
        MEGAKERNEL_PATH, {**MEGAKERNEL_PATH, "comm_sms_backward": 3},
        {**MEGAKERNEL_PATH, "backward_inputs": "recomputed"}, RING])


@pytest.mark.parametrize("world", [2, 4])
def test_emulated_cuda_graph_replay(world):
    gpu_checks.check_emulated_cuda_graph(gpu_checks.ep_specs(world)[1], **MEGAKERNEL_PATH)


def test_fp32_gradients_accumulate_in_place(monkeypatch):
    """The weight-gradient tiles' fp32 epilogue (dw_fp32: Megatron's main_grad) adds dW into
    the given tensors once: their change matches the bf16 gradients of the same backward
    within bf16 rounding, and an expert without rows leaves its tensor's bits untouched. The
    backward's call is redirected to the fp32 tensors (random start values)."""
    spec = SPECS[3]  # empty_expert: the last expert gets no rows
    problem = spec.build()
    max_tokens = max(spec.tokens_per_rank)
    bf16 = gpu_checks.run_cuda(problem, 0, None, max_tokens, **MEGAKERNEL_PATH)
    grads = {}
    launch = ops.moe_backward_megakernel

    def accumulate(*args, dw1, dw2, **kw):
        g = torch.Generator(device="cuda").manual_seed(11)
        for name, dw in (("dw1", dw1), ("dw2", dw2)):
            start = torch.randn(dw.shape, device="cuda", generator=g) * 0.01
            grads[name] = (start.clone(), start)
        addresses = {n: torch.tensor([grads[n][1][e].data_ptr() for e in range(dw1.shape[0])],
                                     dtype=torch.int64, device="cuda") for n in grads}
        launch(*args, dw1_fp32=addresses["dw1"], dw2_fp32=addresses["dw2"], **kw)
        dw1.zero_()
        dw2.zero_()

    monkeypatch.setattr(ops, "moe_backward_megakernel", accumulate)
    gpu_checks.run_cuda(problem, 0, None, max_tokens, **MEGAKERNEL_PATH)
    for name in ("dw1", "dw2"):
        before, after = (t.cpu() for t in grads[name])
        added = after - before
        expected = bf16[name].float()
        err = float((added - expected).norm() / expected.norm())
        assert err < 1e-2, (name, err)
        empty = expected.flatten(1).abs().sum(1) == 0
        assert empty.any(), "the spec has an expert without rows"
        assert torch.equal(after[empty], before[empty]), name
        print(name, f"fp32 accumulate vs bf16 rel-L2 {err:.2e}")
