"""The CUDA backend on one GPU (EP=1: no peers, the same kernels and workspace)."""

import math
import subprocess
import sys

import pytest
import torch

import gpu_checks
from mok_megatron.cuda import ops
from mok_megatron.testing import ProblemSpec
from mok_megatron.cuda.workspace import WorkspaceLayout

pytestmark = pytest.mark.gpu

SPECS = [
    ProblemSpec("uniform", (512,), num_experts=8, hidden=256, ffn=128, topk=4, dtype=torch.bfloat16,
                probs_dtype=torch.float32, routing="uniform"),
    ProblemSpec("zipf", (768,), num_experts=16, hidden=512, ffn=256, topk=6, dtype=torch.bfloat16,
                probs_dtype=torch.float32, routing="zipf", seed=1),
    ProblemSpec("hot", (384,), num_experts=8, hidden=256, ffn=128, topk=1, dtype=torch.bfloat16,
                probs_dtype=torch.float32, routing="hot", seed=2),
    ProblemSpec("empty_expert", (256,), num_experts=8, hidden=128, ffn=64, topk=2,
                dtype=torch.bfloat16, probs_dtype=torch.float32, routing="no_last_expert",
                unused_fraction=0.2, seed=3),
    ProblemSpec("geglu", (256,), num_experts=4, hidden=128, ffn=64, topk=2, dtype=torch.bfloat16,
                probs_dtype=torch.float32, activation="geglu", seed=4),
    ProblemSpec("relu_bf16_probs", (256,), num_experts=4, hidden=128, ffn=64, topk=2,
                dtype=torch.bfloat16, activation="squared_relu", seed=5),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_matches_reference_and_is_deterministic(spec):
    errors = gpu_checks.check_against_reference(spec, 0, None)
    print(spec.name, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("precision", ["bf16", "mxfp8"])
def test_zero_tokens(precision):
    spec = ProblemSpec("zero", (0,), num_experts=4, hidden=64, ffn=32, topk=2,
                       dtype=torch.bfloat16, probs_dtype=torch.float32)
    out = gpu_checks.run_cuda(spec.build(), 0, None, max_tokens=16, precision=precision)
    assert out["y"].shape == (0, 64)
    assert torch.count_nonzero(out["dw1"]) == 0 and torch.count_nonzero(out["dw2"]) == 0


def test_weight_lists_match_stacked():
    gpu_checks.check_weight_lists(SPECS[0], 0, None)


def test_cuda_graph_replay():
    gpu_checks.check_cuda_graph(SPECS[1], 0, None)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_recomputed_backward_matches_reference(spec):
    errors = gpu_checks.check_against_reference(spec, 0, None, backward_inputs="recomputed")
    print(spec.name, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("forward_kernel", ["separate", "megakernel"])
@pytest.mark.parametrize("spec", [SPECS[1], SPECS[4]], ids=lambda s: s.name)
def test_recomputed_backward_bit_identical_to_saved(spec, forward_kernel):
    gpu_checks.check_recomputed_backward(spec, 0, None, forward_kernel=forward_kernel)


@pytest.mark.parametrize("forward_kernel", ["separate", "megakernel"])
@pytest.mark.parametrize("spec", [SPECS[1], SPECS[4], SPECS[5]], ids=lambda s: s.name)
def test_kept_h_bit_identical_to_recomputing_all(spec, forward_kernel):
    gpu_checks.check_kept_h(spec, 0, None, forward_kernel=forward_kernel)


def test_workspace_release_and_recreate():
    from mok_megatron.cuda import workspace

    first = gpu_checks.run_cuda(SPECS[0].build(), 0, None, max_tokens=512)
    device = torch.device("cuda", torch.cuda.current_device())
    assert workspace.workspace_bytes(None, device) > 0
    workspace.release_workspace(None, device)
    assert workspace.workspace_bytes(None, device) == 0
    second = gpu_checks.run_cuda(SPECS[0].build(), 0, None, max_tokens=512)
    for name in gpu_checks.NAMES:
        assert torch.equal(first[name], second[name])


def test_too_many_tokens_is_a_clear_error():
    from mok_megatron.functional import moe_experts

    p = SPECS[0].build().local(0, torch.device("cuda"))
    with pytest.raises(ValueError, match="max_tokens_per_rank=128"):
        moe_experts(p["x"], p["ids"], p["probs"], p["w1"], p["w2"], recipe=gpu_checks.recipe(128))


def test_stall_ends_in_timeout_report():
    """A wait that is never satisfied traps with rank, stage and the flag, instead of hanging."""
    code = ("import torch; from mok_megatron.cuda import ops; "
            "f = torch.zeros(1, dtype=torch.int32, device='cuda'); "
            "ops.stall_for_test(f, 0, 200_000_000); torch.cuda.synchronize()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "TIMEOUT rank 0 stage 4 (test: planted stall)" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned_x", "unaligned_x"])
@pytest.mark.parametrize("prob_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_publish_inputs_writes_every_region(id_dtype, prob_dtype, aligned):
    """One launch puts x, the ids (as int32, unused slots included), the probs (as fp32) and
    the token count where the other ranks read them; the rest of the buffer is untouched."""
    T, H, K = 37, 64, 3
    layout = WorkspaceLayout(64, K, H)
    offsets = layout.offsets()
    buffer = torch.full((layout.nbytes,), 0xAB, dtype=torch.uint8, device="cuda")
    raw = torch.randn(T * H + 1, device="cuda").bfloat16()
    x = (raw[:T * H] if aligned else raw[1:]).view(T, H)  # unaligned: 2 bytes past 16
    ids = torch.randint(-1, 16, (T, K), device="cuda").to(id_dtype)
    probs = torch.rand(T, K, device="cuda").to(prob_dtype)
    ids32 = torch.full((T, K), -7, dtype=torch.int32, device="cuda")
    ops.publish_inputs(x, ids, probs, buffer, offsets, ids32)

    def region(name, dtype, shape):
        n = math.prod(shape) * dtype.itemsize
        return buffer[offsets[name]:offsets[name] + n].view(dtype).view(shape)

    assert torch.equal(region("tokens", torch.bfloat16, (T, H)), x)
    assert torch.equal(region("ids", torch.int32, (T, K)), ids.to(torch.int32))
    assert torch.equal(ids32, ids.to(torch.int32))
    assert torch.equal(region("probs", torch.float32, (T, K)), probs.float())
    assert region("count", torch.int32, (1,)).item() == T
    untouched = region("tokens", torch.uint8, (64 * H * 2,))[T * H * 2:]
    assert (untouched == 0xAB).all(), "rows past T were written"
