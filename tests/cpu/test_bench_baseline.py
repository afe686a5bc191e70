"""The suite's correctness reference, scripts/bench_moe.py's MegatronBaseline (Megatron's
alltoall dispatcher around grouped-GEMM experts), computes the MoE layer: forward and backward
agree with mok's PyTorch reference within the suite's bf16 tolerance at EP=1 and EP=2 (gloo).
Its flex + HybridEP form raises ImportError where HybridEP is not installed, which the suite
records as "unavailable"."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from megatron_harness import run_distributed
from mok_megatron.config import Recipe, load_model
from mok_megatron.functional import moe_experts

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_moe  # noqa: E402

pytest.importorskip("megatron.core")


def baseline_against_reference(dispatcher: str):
    """On each rank: the relative errors of the baseline's y, dx, dprobs and weight gradients
    against the reference's, or ("unavailable", message)."""
    from megatron.core import parallel_state

    rank, world = dist.get_rank(), dist.get_world_size()
    model = load_model("tiny")
    E, H, F, K, T = model.num_experts, model.hidden_size, model.moe_ffn_hidden_size, model.topk, 48
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(T, H, generator=g).bfloat16().requires_grad_()
    ids = torch.rand(T, E, generator=g).topk(K, dim=1).indices.to(torch.int32)
    probs = torch.softmax(torch.randn(T, K, generator=g), dim=1).requires_grad_()
    w1 = (torch.randn(E // world, 2 * F, H, generator=g) * H**-0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E // world, H, F, generator=g) * F**-0.5).bfloat16().requires_grad_()
    dy = torch.randn(T, H, generator=g).bfloat16()
    try:
        baseline = bench_moe.MegatronBaseline(model, E, dispatcher)
    except ImportError as err:
        return "unavailable", str(err)
    group = parallel_state.get_expert_model_parallel_group()

    def reference(*args):
        return moe_experts(*args, group=group, recipe=Recipe(backend="reference"))

    outs = bench_moe.layer_outputs(baseline, x, ids, probs, w1, w2, dy)
    return bench_moe.check_errors(outs, bench_moe.layer_outputs(reference, x, ids, probs, w1,
                                                                w2, dy))


@pytest.mark.parametrize("world", [1, 2])
def test_alltoall_baseline_computes_the_layer(world):
    for errors in run_distributed(world, baseline_against_reference, "alltoall"):
        assert set(errors) == set(bench_moe.CHECKED)
        assert max(errors.values()) <= bench_moe.CHECK_TOLERANCE["bf16"], errors


def test_hybridep_baseline_without_hybridep_is_unavailable():
    if importlib.util.find_spec("deep_ep") is not None:
        pytest.skip("DeepEP is installed here")
    (status, message), = run_distributed(1, baseline_against_reference, "hybridep")
    assert status == "unavailable" and "HybridEP" in message
