"""The MXFP8 recipe on the CUDA backend (the separate kernels, operands.py) on one GPU: the
operand rounding kernels (csrc/quant/mx_round.cu) bit for bit against the reference quantizer
(mxfp8.py) on zeros, subnormals, amax at powers of two, saturation and NaN/Inf; the MoE layer
against the MXFP8 reference (rel-L2 <= 5e-3 for y, dx, dprobs, dW1, dW2) and the BF16
reference (sum|d|/sum|ref| <= 0.1, gradient cosine >= 0.996), bit-identical over runs, EP=1
and emulated EP=2/4, CUDA-graph replay."""

import pytest
import torch

import gpu_checks
from mok_megatron import mxfp8, ops
from test_backward_megakernel import ODD_SPECS
from test_symm_moe import SPECS

pytestmark = pytest.mark.gpu

MXFP8 = {"precision": "mxfp8"}


def _edge_rows(cols: int, g: torch.Generator) -> torch.Tensor:
    """bf16 rows [12, cols], each a kind of block the quantizer must get right."""
    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    rows = [
        randn(cols),                                    # ordinary
        torch.zeros(cols),                              # zero blocks: e = -127
        -torch.zeros(cols),                             # negative zeros kept
        randn(cols, scale=1e-39),                       # fp32/bf16 subnormals
        randn(cols, scale=2.0 ** -120),                 # tiny normal: e clamps at -127
        torch.full((cols,), 448.0 * 2.0 ** 4),          # amax exactly 448 * 2^k
        torch.full((cols,), 2.0 ** 10),                 # a power of two, not 448 * 2^k
        randn(cols, scale=3e38).clamp(-3e38, 3e38),     # near bf16's largest
        randn(cols) * torch.tensor([464.0, 460.0, 452.0, 1.0]).repeat(cols // 4 + 1)[:cols],
        randn(cols, scale=1e4),
    ]
    nan_row = randn(cols)
    nan_row[5] = float("nan")
    inf_row = randn(cols)
    inf_row[-1] = float("-inf")
    return torch.stack(rows + [nan_row, inf_row]).to(torch.bfloat16)


def _assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit-identical where finite, NaN exactly where the reference has NaN."""
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"{what}: NaN in other places"
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16)), \
        f"{what}: {int((got[~nan] != want[~nan]).sum())} values differ"


@pytest.mark.parametrize("cols", [32, 96, 200, 7168])
def test_columns_bit_exact(cols):
    g = torch.Generator().manual_seed(cols)
    x = torch.cat([_edge_rows(cols, g), (torch.randn(500, cols, generator=g) * 3)
                   .to(torch.bfloat16)])
    want = mxfp8.fake_quantize(x, dim=1).to(torch.bfloat16)
    got = ops.mx_round_columns(x.cuda()).cpu()
    _assert_same(got, want, f"columns cols={cols}")
    # Only the first num_rows rows are written.
    limit = torch.tensor([7], dtype=torch.int32, device="cuda")
    part = ops.mx_round_columns(x.cuda(), limit).cpu()
    _assert_same(part[:7], want[:7], "columns, first 7 rows")


def test_segments_bit_exact_per_segment():
    """Blocks from each segment's first row, short last blocks, empty and hot segments."""
    g = torch.Generator().manual_seed(3)
    counts = [0, 33, 1, 64, 0, 200, 31, 5000, 0]
    cols = 136
    edges = _edge_rows(cols, g)
    x = (torch.randn(sum(counts), cols, generator=g) * 2).to(torch.bfloat16)
    x[40:40 + edges.shape[0]] = edges  # the edge cases inside segment 3 and 5
    offsets = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
    got = ops.mx_round_segments(x.cuda(), offsets.cuda()).cpu()
    for s in range(len(counts)):
        a, b = int(offsets[s]), int(offsets[s + 1])
        want = mxfp8.fake_quantize(x[a:b], dim=0).to(torch.bfloat16)
        _assert_same(got[a:b], want, f"segment {s} ({b - a} rows)")


def test_segments_uniform_is_a_weight_per_expert():
    """segment_rows: a stacked weight [E, r, c] rounded along each expert's r (its other
    orientation), as the reference rounds W [r, c] along dim 0."""
    g = torch.Generator().manual_seed(4)
    w = (torch.randn(5, 264, 72, generator=g) * 0.02).to(torch.bfloat16)
    got = ops.mx_round_segments(w.reshape(-1, 72).cuda(), segment_rows=264).view(5, 264, 72)
    for e in range(5):
        want = mxfp8.fake_quantize(w[e], dim=0).to(torch.bfloat16)
        _assert_same(got[e].cpu(), want, f"expert {e}")


@pytest.mark.parametrize("spec", SPECS + ODD_SPECS, ids=lambda s: s.name)
def test_layer_matches_mxfp8_reference_and_is_deterministic(spec):
    errors = gpu_checks.check_against_reference(spec, 0, None, **MXFP8)
    print(spec.name, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("spec", SPECS[:3], ids=lambda s: s.name)
def test_layer_against_bf16_reference(spec):
    """What the recipe costs in accuracy: the issue's bounds against the BF16 reference."""
    problem = spec.build()
    max_tokens = max(spec.tokens_per_rank)
    kernel = gpu_checks.run_cuda(problem, 0, None, max_tokens, **MXFP8)
    bf16 = gpu_checks.run_cuda(problem, 0, None, max_tokens, backend="reference")
    for name in gpu_checks.NAMES:
        got, want = kernel[name].double().flatten(), bf16[name].double().flatten()
        ratio = float((got - want).abs().sum() / want.abs().sum())
        assert ratio <= 0.1, (name, ratio)
        if name != "y":
            cosine = float(got @ want / (got.norm() * want.norm()))
            assert cosine >= 0.996, (name, cosine)
        print(spec.name, name, f"sum|d|/sum|ref| {ratio:.2e}")


def test_recomputed_equals_saved():
    gpu_checks.check_recomputed_backward(SPECS[1], 0, None, **MXFP8)


def test_cuda_graph_replay():
    gpu_checks.check_cuda_graph(SPECS[1], 0, None, **MXFP8)


NAMES = [s.name for s in gpu_checks.ep_specs(2)]


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
@pytest.mark.parametrize("world", [2, 4])
def test_emulated_group_matches_reference(world, index):
    spec = gpu_checks.ep_specs(world)[index]
    errors = gpu_checks.check_emulated_against_reference(spec, **MXFP8)
    print(f"EP={world}", spec.name, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("world", [2, 4])
def test_emulated_group_bit_identical_to_one_rank(world):
    gpu_checks.check_emulated_settings(gpu_checks.ep_specs(world)[3], [MXFP8])


def test_emulated_cuda_graph_replay():
    gpu_checks.check_emulated_cuda_graph(gpu_checks.ep_specs(2)[1], **MXFP8)

