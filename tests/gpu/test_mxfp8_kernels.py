"""The MXFP8 recipe on the CUDA backend (the separate kernels, operands.py) on one GPU: the
operand rounding kernels (csrc/quant/mx_round.cu; both ways in one pass, mx_round_both.cu) bit
for bit against the reference quantizer (mxfp8.py) on zeros, subnormals, amax at powers of
two, saturation and NaN/Inf; the MoE layer against the MXFP8 reference (rel-L2 <= 5e-3 for
y, dx, dprobs, dW1, dW2) and the BF16 reference (sum|d|/sum|ref| <= 0.1, gradient cosine >=
0.996), bit-identical over runs, EP=1 and emulated EP=2/4, CUDA-graph replay, with the
weights in either form (kernel.mxfp8_weights: codes, rounded); the engine that dequantizes
weight codes against fp32 products of MXFP8 values in both weight orientations; the forward
megakernel under the recipe against the reference and bit for bit the separate path; the
backward megakernel under the recipe against the reference and the separate backward."""

import pytest
import torch

import gpu_checks
from mok_megatron.recipes import fp8_blockwise, mxfp8
from mok_megatron.cuda import ops
from mok_megatron.activations import get_activation
from mok_megatron.functional import moe_experts
from test_backward_megakernel import ODD_SPECS
from test_symm_moe import SPECS

pytestmark = pytest.mark.gpu

MXFP8 = {"precision": "mxfp8"}
# kernel.mxfp8_weights forced both ways (auto picks by rows per expert: the small specs here
# would all get codes).
FORMS = {f: {**MXFP8, "mxfp8_weights": f} for f in ("codes", "rounded")}


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


def _rounded_along_rows(x: torch.Tensor, block: int) -> torch.Tensor:
    """The reference's rounding along dim 0: MXFP8's 32-row blocks or the blockwise recipe's
    128 (fp8_blockwise, the same scale rule), as bf16."""
    if block == ops.MX_BLOCK:
        return mxfp8.fake_quantize(x, dim=0).to(torch.bfloat16)
    return fp8_blockwise.fake_quantize_rows(x, dim=0).to(torch.bfloat16)


@pytest.mark.parametrize("block", [32, 128])
def test_segments_bit_exact_per_segment(block):
    """Blocks from each segment's first row, short last blocks, empty and hot segments, a last
    column block that is not whole (136 columns)."""
    g = torch.Generator().manual_seed(3)
    counts = [0, 33, 1, 64, 0, 200, 31, 5000, 0, 300, 128]
    cols = 136
    edges = _edge_rows(cols, g)
    x = (torch.randn(sum(counts), cols, generator=g) * 2).to(torch.bfloat16)
    x[40:40 + edges.shape[0]] = edges  # the edge cases inside segment 3 and 5
    offsets = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
    poisoned = torch.full((x.shape[0] + 7, cols), float("nan"), dtype=torch.bfloat16,
                          device="cuda")
    ops.extension().mx_round_segments(x.cuda(), offsets.cuda(), 0, block, poisoned[:-7])
    got = poisoned.cpu()
    for s in range(len(counts)):
        a, b = int(offsets[s]), int(offsets[s + 1])
        _assert_same(got[a:b], _rounded_along_rows(x[a:b], block), f"segment {s} ({b - a} rows)")
    assert bool(got[-7:].isnan().all()), "rows past the last segment were written"


@pytest.mark.parametrize("block", [32, 128])
def test_segments_uniform_is_a_weight_per_expert(block):
    """segment_rows: a stacked weight [E, r, c] rounded along each expert's r (its other
    orientation), as the reference rounds W [r, c] along dim 0."""
    g = torch.Generator().manual_seed(4)
    w = (torch.randn(5, 264, 72, generator=g) * 0.02).to(torch.bfloat16)
    got = ops.mx_round_segments(w.reshape(-1, 72).cuda(), segment_rows=264,
                                block=block).view(5, 264, 72)
    for e in range(5):
        _assert_same(got[e].cpu(), _rounded_along_rows(w[e], block), f"expert {e}")


def _segmented(counts: list, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [sum(counts) + 7, cols] with the edge rows inside segments 3 and 5 (7 rows past the
    last segment), and the int32 offsets of segments of `counts` rows."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(sum(counts) + 7, cols, generator=g) * 2).to(torch.bfloat16)
    edges = _edge_rows(cols, g)
    x[40:40 + edges.shape[0]] = edges
    offsets = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
    return x, offsets


SEGMENT_COUNTS = [0, 33, 1, 64, 0, 200, 31, 2000, 0]


@pytest.mark.parametrize("cols", [32, 200, 7168])
def test_round_both_is_columns_and_segments(cols):
    """One pass gives mx_round_columns and mx_round_segments bit for bit (and the reference
    along each row), short blocks at segment ends and at the last columns, empty segments,
    NaN/Inf blocks; rows past the last segment stay as they were."""
    x, offsets = _segmented(SEGMENT_COUNTS, cols, seed=cols)
    n = int(offsets[-1])
    xc, oc = x.cuda(), offsets.cuda()
    along_k, along_n = ops.mx_round_both(xc, oc)
    _assert_same(along_k[:n].cpu(), ops.mx_round_columns(xc)[:n].cpu(), "along K vs columns")
    _assert_same(along_k[:n].cpu(), mxfp8.fake_quantize(x[:n], dim=1).to(torch.bfloat16),
                 "along K vs the reference")
    _assert_same(along_n[:n].cpu(), ops.mx_round_segments(xc, oc)[:n].cpu(),
                 "along the rows vs segments")
    poison = torch.full_like(xc, float("nan"))
    along_k2, along_n2 = poison.clone(), poison.clone()
    ops.extension().mx_round_both(xc, oc, along_k2, along_n2)
    assert bool(along_k2[n:].isnan().all() and along_n2[n:].isnan().all()), \
        "rows past the last segment were written"
    assert torch.equal(along_k2[:n].view(torch.int16), along_k[:n].view(torch.int16))
    assert torch.equal(along_n2[:n].view(torch.int16), along_n[:n].view(torch.int16))


def test_round_both_refuses_bad_operands():
    x = torch.zeros(8, 36, dtype=torch.bfloat16, device="cuda")
    offsets = torch.tensor([0, 8], dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="multiple of 8"):
        ops.mx_round_both(x, offsets)
    with pytest.raises(RuntimeError, match="offsets must be int32"):
        ops.mx_round_both(x[:, :32].contiguous(), offsets.long())


@pytest.mark.parametrize("block", [mxfp8.BLOCK, ops.FP8_BLOCK])
def test_segment_codes_are_the_rounded_segments(block):
    """Saved rows kept as codes along the expert's rows (quant/segment_codes.cu) give back
    mx_round_segments' values bit for bit (NaN where it has NaN): the edge rows of every kind,
    empty segments, segments shorter than a block, a segment of exact blocks; the codes take
    one byte per value and the rows outside every segment are not written."""
    g = torch.Generator().manual_seed(block)
    cols = 200
    edge = _edge_rows(cols, g)
    rows = torch.cat([edge] * 6 + [torch.randn(300, cols, generator=g).to(torch.bfloat16)])
    rows = rows[torch.randperm(rows.shape[0], generator=g)].cuda()
    bounds = [0, 0, 5, 5, 5 + 2 * block, 5 + 2 * block + 37, rows.shape[0] - 3]
    offsets = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    codes, scales = ops.mx_quantize_segments(rows, offsets, block)
    assert codes.dtype == torch.uint8 and codes.shape == rows.shape
    assert scales.shape == (ops.segment_scale_rows(rows.shape[0], len(bounds) - 1, block), cols)
    got = ops.mx_dequantize_segments(codes, scales, offsets, block)
    want = ops.mx_round_segments(rows, offsets, block=block)
    end = bounds[-1]
    _assert_same(got[:end].cpu(), want[:end].cpu(), f"block {block}")
    assert got[:end].isnan().any(), "the edge rows' NaN and Inf blocks are in the test"
    with pytest.raises(RuntimeError, match="block must be"):
        ops.mx_quantize_segments(rows, offsets, 64)
    with pytest.raises(RuntimeError, match="scales must be"):
        ops.mx_dequantize_segments(codes, scales[:2], offsets, block)


@pytest.mark.parametrize("precision", ["mxfp8", "fp8_blockwise"])
def test_saved_rows_are_kept_as_codes(precision):
    """With saved backward inputs an FP8 recipe keeps forward's rows as codes along the
    expert's rows (one byte per value), not as bf16 rows; test_recomputed_equals_saved checks
    the gradients are the same bits."""
    spec = SPECS[1]
    problem = spec.build()
    inputs = problem.local(0, torch.device("cuda"))
    rec = gpu_checks.recipe(max(spec.tokens_per_rank), precision=precision,
                            backward_inputs="saved")
    y = moe_experts(inputs["x"], inputs["ids"], inputs["probs"], inputs["w1"], inputs["w2"],
                    activation=spec.activation, recipe=rec)
    node, seen = y.grad_fn, []
    while node is not None and type(node).__name__ != "_SymmMoEBackward":
        seen.append(type(node).__name__)
        node = next((f for f, _ in node.next_functions if f is not None), None)
    assert node is not None, f"no _SymmMoE node under y: {seen}"
    hidden, f1 = inputs["x"].shape[1], inputs["w1"].shape[1]
    kept = [(t.dtype, tuple(t.shape)) for t in node.saved_tensors
            if t is not None and t.dim() == 2 and t.shape[1] == hidden]
    codes = [shape for dtype, shape in kept if dtype == torch.uint8]
    assert len(codes) == 2 and codes[0][0] >= codes[1][0], kept  # codes [cap, H], scales
    # Only h [cap, F1] may be bf16 among them (when F1 == H).
    assert sum(dtype == torch.bfloat16 for dtype, _ in kept) == (f1 == hidden), kept
    y.sum().backward()
    assert torch.isfinite(inputs["w1"].grad).all()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS + ODD_SPECS, ids=lambda s: s.name)
def test_layer_matches_mxfp8_reference_and_is_deterministic(spec, form):
    errors = gpu_checks.check_against_reference(spec, 0, None, **FORMS[form])
    print(spec.name, form, {k: f"{v:.2e}" for k, v in errors.items()})


# The forward megakernel under the recipe (csrc/megakernel/moe_forward.cu: x rounded at its
# source, act rounded by the storer, the weights as values or codes), backward separate.
MEGAKERNEL = {f: {**FORMS[f], "forward_kernel": "megakernel"} for f in FORMS}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS + ODD_SPECS, ids=lambda s: s.name)
def test_forward_megakernel_is_the_separate_path(spec, form):
    """Against the MXFP8 reference (tolerances, 3 runs bit-identical) and bit for bit the
    separate path's y and gradients: the same rounded operands on the same tile engine,
    short blocks of F (odd sizes) and skewed routings included."""
    errors = gpu_checks.check_against_reference(spec, 0, None, **MEGAKERNEL[form])
    problem = spec.build()
    max_tokens = max(max(spec.tokens_per_rank), 1)
    gpu_checks.assert_same_bits(gpu_checks.run_cuda(problem, 0, None, max_tokens, **FORMS[form]),
                                gpu_checks.run_cuda(problem, 0, None, max_tokens,
                                                    **MEGAKERNEL[form]),
                                f"({spec.name}) between the separate path and the megakernel")
    print(spec.name, form, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("form", FORMS)
def test_forward_megakernel_settings_and_graph_replay(form):
    """Pulling blocks, minibatches and the macrobatch ring's size never change the bits;
    a CUDA graph replays the megakernel under the recipe bit for bit."""
    spec = SPECS[1]
    problem = spec.build()
    max_tokens = max(spec.tokens_per_rank)
    settings = [{}, {"comm_sms_forward": 1, "minibatch_tokens": 37},
                {"comm_sms_forward": 32, "macrobatch_tokens": 128}]
    runs = [gpu_checks.run_cuda(problem, 0, None, max_tokens, **MEGAKERNEL[form], **knobs)
            for knobs in settings]
    for knobs, run in zip(settings[1:], runs[1:]):
        gpu_checks.assert_same_bits(runs[0], run, f"({spec.name}) with {knobs}")
    gpu_checks.check_cuda_graph(spec, 0, None, **MEGAKERNEL[form])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("world", [2, 4])
def test_forward_megakernel_emulated_group(world, form):
    """EP=2/4 emulated on one GPU: the megakernel's bits are the separate path's and the
    whole problem's on one rank; against the reference within the recipe's tolerances."""
    spec = gpu_checks.ep_specs(world)[3]
    gpu_checks.check_emulated_settings(spec, [MEGAKERNEL[form], FORMS[form]])
    errors = gpu_checks.check_emulated_against_reference(gpu_checks.ep_specs(world)[1],
                                                         **MEGAKERNEL[form])
    print(f"EP={world}", form, {k: f"{v:.2e}" for k, v in errors.items()})


# The backward megakernel under the recipe (csrc/megakernel/moe_backward.cu kMx: rounding tiles
# for dY, x, act and dh, the dgrads on the transposed rounded weights), recomputed inputs, after
# the separate forward or the forward megakernel; macrobatches of 2 m-blocks, or of one (every
# expert's weight gradient carried across them).
BACKWARD_MK = {**FORMS["rounded"], "backward_kernel": "megakernel", "comm_sms_backward": 8,
               "backward_inputs": "recomputed", "macrobatch_tokens": 256}
BACKWARD_SETTINGS = {
    "separate_forward": BACKWARD_MK,
    "megakernels": {**BACKWARD_MK, "forward_kernel": "megakernel", "comm_sms_forward": 8},
    "ring_one_mblock": {**BACKWARD_MK, "macrobatch_tokens": 128},
}


@pytest.mark.parametrize("setting", BACKWARD_SETTINGS)
@pytest.mark.parametrize("spec", SPECS + ODD_SPECS, ids=lambda s: s.name)
def test_backward_megakernel_matches_mxfp8_reference(spec, setting):
    """gpu_checks.check_backward_megakernel: against the MXFP8 reference and the separate
    backward; y unchanged."""
    gpu_checks.check_backward_megakernel(spec, **BACKWARD_SETTINGS[setting])


def test_backward_megakernel_settings_and_graph_replay():
    """Pulling blocks, minibatches and macrobatch sizes never change the backward
    megakernel's bits under the recipe; a CUDA graph replays it bit for bit."""
    gpu_checks.check_backward_megakernel_settings(SPECS[1], **BACKWARD_MK)
    gpu_checks.check_cuda_graph(SPECS[1], 0, None, **BACKWARD_SETTINGS["megakernels"])


@pytest.mark.parametrize("world", [2, 4])
def test_backward_megakernel_emulated_group(world):
    """EP=2/4 emulated on one GPU: the same bits as the whole problem on one rank, across
    settings; against the reference within the recipe's tolerances."""
    gpu_checks.check_backward_megakernel_emulated(world, BACKWARD_SETTINGS["megakernels"],
                                                  BACKWARD_SETTINGS["ring_one_mblock"])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS[:3], ids=lambda s: s.name)
def test_layer_against_bf16_reference(spec, form):
    """What the recipe costs in accuracy: the issue's bounds against the BF16 reference."""
    ratios = gpu_checks.check_against_bf16_reference(spec, **FORMS[form])
    print(spec.name, form, {k: f"{v:.2e}" for k, v in ratios.items()})


@pytest.mark.parametrize("form", FORMS)
def test_recomputed_equals_saved(form):
    gpu_checks.check_recomputed_backward(SPECS[1], 0, None, **FORMS[form])


@pytest.mark.parametrize("forward_kernel", ["separate", "megakernel"])
@pytest.mark.parametrize("form", FORMS)
def test_kept_h_bit_identical_to_recomputing_all(form, forward_kernel):
    gpu_checks.check_kept_h(SPECS[1], 0, None, forward_kernel=forward_kernel, **FORMS[form])


@pytest.mark.parametrize("form", FORMS)
def test_cuda_graph_replay(form):
    gpu_checks.check_cuda_graph(SPECS[1], 0, None, **FORMS[form])


NAMES = [s.name for s in gpu_checks.ep_specs(2)]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
@pytest.mark.parametrize("world", [2, 4])
def test_emulated_group_matches_reference(world, index, form):
    spec = gpu_checks.ep_specs(world)[index]
    errors = gpu_checks.check_emulated_against_reference(spec, **FORMS[form])
    print(f"EP={world}", spec.name, form, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("world", [2, 4])
def test_emulated_group_bit_identical_to_one_rank(world, form):
    gpu_checks.check_emulated_settings(gpu_checks.ep_specs(world)[3], [FORMS[form]])


@pytest.mark.parametrize("form", FORMS)
def test_emulated_cuda_graph_replay(form):
    gpu_checks.check_emulated_cuda_graph(gpu_checks.ep_specs(2)[1], **FORMS[form])



def _gemm_scales(scales: torch.Tensor, rows: int) -> torch.Tensor:
    """The GEMM layout [1, blocks, 1, padded] of one matrix back to mxfp8.quantize's
    [rows, blocks]."""
    return scales[0, :, 0, :rows].T.cpu()


def _finite_blocks(scales: torch.Tensor, cols: int) -> torch.Tensor:
    """Per element: its block's scale is not the NaN code ([rows, blocks] scales)."""
    return (scales != mxfp8.E8M0_NAN).repeat_interleave(mxfp8.BLOCK, dim=1)[:, :cols]


def _assert_codes(codes, scales, want_q, want_s, what):
    assert torch.equal(scales, want_s), f"{what}: scales differ"
    finite = _finite_blocks(want_s, want_q.shape[1])
    got = codes.cpu().view(torch.uint8)
    assert torch.equal(got[finite], want_q.view(torch.uint8)[finite]), f"{what}: codes differ"


@pytest.mark.parametrize("cols", [32, 96, 200, 7168])
def test_quantize_columns_codes_bit_exact(cols):
    """E4M3 codes and E8M0 scales as mxfp8.quantize gives them, into a padded view whose pad
    is left alone; dequantized, what mx_round_columns writes."""
    g = torch.Generator().manual_seed(100 + cols)
    x = torch.cat([_edge_rows(cols, g), (torch.randn(300, cols, generator=g) * 3)
                   .to(torch.bfloat16)])
    rows = x.shape[0]
    want_q, want_s = mxfp8.quantize(x, dim=1)
    padded = -(-cols // 16) * 16 + 16
    buf = torch.full((rows, padded), 0x5A, dtype=torch.uint8, device="cuda")
    codes = buf.view(torch.float8_e4m3fn)[:, :cols]
    scales = torch.zeros(1, -(-cols // 32), 1, -(-rows // 16) * 16, dtype=torch.uint8,
                         device="cuda")
    ops.mx_quantize_columns(x.cuda(), codes, scales, matrix_rows=rows)
    _assert_codes(codes, _gemm_scales(scales, rows), want_q, want_s, f"cols={cols}")
    assert bool((buf[:, cols:] == 0x5A).all()), "the pad was written"
    _assert_same(mxfp8.dequantize(codes.cpu(), _gemm_scales(scales, rows), dim=1)
                 .to(torch.bfloat16), ops.mx_round_columns(x.cuda()).cpu(), "codes dequantized")


@pytest.mark.parametrize("r,c", [(64, 32), (200, 104), (2048, 136)])
def test_quantize_rows_transposed_bit_exact(r, c):
    """Each matrix of w [E, r, c] along its rows, written as codes [E, c, r]: what
    mxfp8.quantize(w[e], dim=0) gives, transposed; short last blocks, edge values."""
    from mok_megatron.cuda.mxfp8_weights import quantize_weight_transposed

    g = torch.Generator().manual_seed(r + c)
    E = 3
    w = (torch.randn(E, r, c, generator=g) * 0.05).to(torch.bfloat16)
    w[1, :12] = _edge_rows(c, g)
    q = quantize_weight_transposed(w.cuda())
    for e in range(E):
        want_q, want_s = mxfp8.quantize(w[e], dim=0)
        _assert_codes(q.codes[e], q.scales[e, :, 0, :c].T.cpu(), want_q.T, want_s.T,
                      f"matrix {e} ({r}x{c})")


# Ragged experts with empty ones, a 1-row and a 257-row expert.
_COUNTS = [0, 1, 63, 64, 65, 130, 0, 257]


@pytest.mark.parametrize("activation", [None, "swiglu", "squared_relu"])
@pytest.mark.parametrize("k,n", [(256, 384), (200, 208)], ids=["aligned", "odd"])
def test_mx_weight_gemm_equals_engine_on_rounded_weights(activation, k, n):
    """The tile engine with weight codes dequantized in shared memory gives, bit for bit, the
    engine's result on the weights mx_round_columns rounds (out and h), every run."""
    from mok_megatron.cuda.mxfp8_weights import quantize_weight

    g = torch.Generator(device="cuda").manual_seed(k + n)
    E, rows = len(_COUNTS), sum(_COUNTS)
    offsets = torch.tensor([0] + torch.tensor(_COUNTS).cumsum(0).tolist(), dtype=torch.int32,
                           device="cuda")
    a = ops.mx_round_columns(torch.randn(rows, k, device="cuda", generator=g)
                             .to(torch.bfloat16))
    w = (torch.randn(E, n, k, device="cuda", generator=g) * k**-0.5).to(torch.bfloat16)
    prob = torch.rand(rows, device="cuda", generator=g)
    gated = activation == "swiglu"
    n_out = n // 2 if gated else n
    epilogue = {} if activation is None else dict(activation=activation, row_prob=prob)

    def run(weight, scales=None):
        out = torch.full((rows, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
        h = (torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
             if activation else None)
        ops.grouped_gemm(a, weight, offsets, out, h_out=h, w_scales=scales, **epilogue)
        return out, h

    q = quantize_weight(w, halves=2 if gated else 1)
    want = run(ops.mx_round_columns(w.view(E * n, k)).view(E, n, k))
    for _ in range(3):
        got = run(q.codes, q.scales)
        for name, x, y in zip(("out", "h"), got, want):
            if y is not None:
                _assert_same(x, y, f"{name} ({activation}, K={k}, N={n})")
    # And the product is the right one: against fp32 matmuls of the dequantized operands.
    for e in range(E):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi > lo and activation is None:
            wd = mxfp8.dequantize(q.codes[e].cpu(), _gemm_scales(q.scales[e:e + 1], n), dim=1)
            ref = a[lo:hi].float().cpu() @ wd.T
            err = (got[0][lo:hi].float().cpu() - ref).norm() / ref.norm()
            assert err < 1e-2, (e, float(err))


@pytest.mark.parametrize("activation", [None, "swiglu"])
def test_weight_codes_dequantize_bit_exact_at_every_scale(activation):
    """The stage's conversion (gemm/sm90/mx_weight_stage.cuh: codes placed as bf16 bits, one
    bf16x2 multiply by the scale, a second above scale code 134) on blocks at scales from
    2^-127 (bf16 subnormal results) to 2^120 and a NaN block: one-hot rows make the GEMM's
    out (or h) the weight's transpose, so every dequantized value is compared bit for bit
    with the engine on the weights mx_round_columns rounds."""
    from mok_megatron.cuda.mxfp8_weights import quantize_weight

    g = torch.Generator(device="cuda").manual_seed(11)
    k, n = 256, 128
    w = torch.randn(1, n, k, device="cuda", generator=g)
    exponents = torch.tensor([-133, -128, -120, -90, -30, 0, 5, 9, 16, 40, 100, 120],
                             device="cuda")
    scale = torch.pow(2.0, exponents[torch.randint(0, len(exponents), (n, k // 32),
                                                   device="cuda", generator=g)].float())
    w = (w * scale.repeat_interleave(32, dim=1)).to(torch.bfloat16)
    w[0, 3, 40] = float("nan")  # one NaN block: output column 3 only
    a = torch.eye(k, device="cuda").to(torch.bfloat16)
    offsets = torch.tensor([0, k], dtype=torch.int32, device="cuda")
    gated = activation == "swiglu"
    epilogue = {} if activation is None else dict(
        activation=activation, row_prob=torch.ones(k, device="cuda"))

    def run(weight, scales=None):
        out = torch.full((k, n // 2 if gated else n), 7.0, dtype=torch.bfloat16, device="cuda")
        h = torch.full((k, n), 7.0, dtype=torch.bfloat16, device="cuda") if gated else None
        ops.grouped_gemm(a, weight, offsets, out, h_out=h, w_scales=scales, **epilogue)
        return h if gated else out

    q = quantize_weight(w, halves=2 if gated else 1)
    rounded = ops.mx_round_columns(w.view(n, k)).view(1, n, k)
    want = run(rounded)
    # The engine passes W^T through (normal values; what the tensor cores do with bf16
    # subnormals is the same for both runs compared below).
    wt = rounded[0].T
    normal = ~wt.isnan().any(dim=0, keepdim=True).expand(k, n) & (wt.float().abs() >= 2.0**-126)
    assert torch.equal(want[normal].view(torch.int16), wt[normal].view(torch.int16)), \
        "the engine does not pass W^T through"
    _assert_same(run(q.codes, q.scales), want, f"dequantized codes ({activation})")


def _products_of_mxfp8_values(a, w, offsets, w_dim):
    """fp32 products of the reference's MXFP8 values: a rounded along its rows' K, each expert's
    w [N, K] along K (w_dim 2: w given [E, N, K]) or, given [E, K, N] (w_dim 1: the dgrad
    orientation, rounded along its rows), the same values transposed."""
    av = mxfp8.fake_quantize(a.float(), dim=1)
    wv = mxfp8.fake_quantize(w.float(), dim=w_dim)
    if w_dim == 1:
        wv = wv.transpose(1, 2)
    return torch.cat([av[o0:o1] @ wv[e].t() for e, (o0, o1) in
                      enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist()))])


@pytest.mark.parametrize("activation", [None, "swiglu", "squared_relu"])
@pytest.mark.parametrize("k,n", [(256, 384), (200, 80), (7168, 256)],
                         ids=["aligned", "odd", "deep"])
def test_dequantizing_engine_matches_products_of_mxfp8_values(activation, k, n):
    """The engine the recipe runs every forward GEMM on (weight codes dequantized in shared
    memory, a MX-rounded by mx_round_columns): against fp32 products of the reference's MXFP8
    values of both operands, rel-L2 <= 2e-3 (the values are the same; only fp32 summation
    order differs, then the shared bf16 rounding), on rows at very different scales, a
    non-finite activation block and a NaN weight; NaN exactly where one reaches; rows outside
    the experts untouched; bit-identical over 3 runs. "odd": K not a multiple of 32, a gated F
    of 40."""
    from mok_megatron.cuda.mxfp8_weights import quantize_weight

    g = torch.Generator(device="cuda").manual_seed(k + n)
    E, rows = len(_COUNTS), sum(_COUNTS)
    offsets = torch.tensor([0] + torch.tensor(_COUNTS).cumsum(0).tolist(), dtype=torch.int32,
                           device="cuda")
    a = (torch.randn(rows, k, device="cuda", generator=g)
         * torch.exp2(torch.randint(-6, 6, (rows, 1), device="cuda", generator=g).float()))
    a[5, : k // 2] *= 2.0 ** -20  # blocks of one row at very different scales
    a[70, 3] = float("inf")  # a non-finite block: that row's outputs are NaN
    a = a.bfloat16()
    w = torch.randn(E, n, k, device="cuda", generator=g) * k**-0.5
    w[:, : n // 3] *= 16.0
    w[3, 7, k - 1] = float("nan")  # expert 3's weight row 7 (its last K block)
    w = w.bfloat16()
    prob = torch.rand(rows, device="cuda", generator=g)
    gated = activation == "swiglu"
    n_out = n // 2 if gated else n
    q = quantize_weight(w, halves=2 if gated else 1)
    a_rounded = ops.mx_round_columns(a)
    epilogue = {} if activation is None else dict(activation=activation, row_prob=prob)
    results = []
    for _ in range(3):
        out = torch.full((rows + 5, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
        h = (torch.full((rows + 5, n), float("nan"), dtype=torch.bfloat16, device="cuda")
             if activation else None)
        ops.grouped_gemm(a_rounded, q.codes, offsets, out, h_out=h, w_scales=q.scales,
                         **epilogue)
        results.append((out, h))
    for out, h in results[1:]:
        _assert_same(out, results[0][0], "out, run to run")
        if h is not None:
            _assert_same(h, results[0][1], "h, run to run")
    out, h = results[0]
    assert out[rows:].isnan().all(), "rows outside the experts were written"
    ref = _products_of_mxfp8_values(a, w, offsets, w_dim=2)
    got = out[:rows] if activation is None else h[:rows]
    assert torch.equal(got.isnan(), ref.isnan()), "NaN in other places"
    ok = ~ref.isnan()
    err = ((got.float()[ok] - ref.bfloat16().float()[ok]).norm() / ref[ok].norm()).item()
    assert err <= 2e-3, err
    if activation is not None:
        # The epilogue's activation of the engine's own h (rows without a NaN in h: torch's
        # relu maps NaN to 0 where the epilogue keeps it).
        fin = ~h[:rows].isnan().any(dim=1)
        want = (get_activation(activation)(h[:rows][fin].float())
                * prob[fin].unsqueeze(1)).bfloat16()
        err = ((out[:rows][fin].float() - want.float()).norm() / want.float().norm()).item()
        assert err <= 2e-3, ("act", err)


@pytest.mark.parametrize("r,c", [(7168, 256), (200, 72), (4096, 7168)],
                         ids=["fc2_dgrad", "odd", "fc1_dgrad"])
def test_dequantizing_engine_dgrad_orientation(r, c):
    """The recipe's dgrads: a [rows, r] times a weight W [E, r, c] stored transposed by
    quantize_weight_transposed (codes [E, c, r], blocks along r), against fp32 products of the
    reference's MXFP8 values (W rounded along its rows), rel-L2 <= 2e-3, NaN where a NaN
    weight block reaches, bit-identical over 3 runs."""
    from mok_megatron.cuda.mxfp8_weights import quantize_weight_transposed

    g = torch.Generator(device="cuda").manual_seed(r + c)
    E, rows = len(_COUNTS), sum(_COUNTS)
    offsets = torch.tensor([0] + torch.tensor(_COUNTS).cumsum(0).tolist(), dtype=torch.int32,
                           device="cuda")
    a = (torch.randn(rows, r, device="cuda", generator=g)
         * torch.exp2(torch.randint(-6, 6, (rows, 1), device="cuda", generator=g).float()))
    a = a.bfloat16()
    w = torch.randn(E, r, c, device="cuda", generator=g) * r**-0.5
    w[:, :, : c // 3] *= 16.0
    w[2, r - 1, 5] = float("nan")  # expert 2's output column 5 (its last block along r)
    w = w.bfloat16()
    q = quantize_weight_transposed(w)
    a_rounded = ops.mx_round_columns(a)
    outs = []
    for _ in range(3):
        out = torch.full((rows, c), float("nan"), dtype=torch.bfloat16, device="cuda")
        ops.grouped_gemm(a_rounded, q.codes, offsets, out, w_scales=q.scales)
        outs.append(out)
    for out in outs[1:]:
        _assert_same(out, outs[0], "dgrad, run to run")
    ref = _products_of_mxfp8_values(a, w, offsets, w_dim=1)
    got = outs[0]
    assert torch.equal(got.isnan(), ref.isnan()), "NaN in other places"
    ok = ~ref.isnan()
    err = ((got.float()[ok] - ref.bfloat16().float()[ok]).norm() / ref[ok].norm()).item()
    assert err <= 2e-3, err


def test_fp8_engine_refuses_mxfp8_scales():
    """The FP8 engine runs the blockwise recipe only: MXFP8 weight scales (per 32 of K) are
    refused by name before anything runs."""
    from mok_megatron.cuda.mxfp8_weights import quantize_weight

    w = torch.randn(2, 128, 256, device="cuda").bfloat16()
    q = quantize_weight(w)
    a_codes, a_scales = ops.fp8_quantize_rows(torch.randn(8, 256, device="cuda").bfloat16())
    offsets = torch.tensor([0, 4, 8], dtype=torch.int32, device="cuda")
    out = torch.empty(8, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="w_scales must be contiguous uint8 E8M0 per 128"):
        ops.fp8_grouped_gemm(a_codes, a_scales, q.codes, q.scales, offsets, out)


def test_mx_weight_gemm_rejects_unaligned_codes():
    w = torch.zeros(2, 64, 200, dtype=torch.float8_e4m3fn, device="cuda")
    a = torch.zeros(4, 200, dtype=torch.bfloat16, device="cuda")
    offsets = torch.tensor([0, 2, 4], dtype=torch.int32, device="cuda")
    out = torch.empty(4, 64, dtype=torch.bfloat16, device="cuda")
    scales = torch.zeros(2, 7, 1, 64, dtype=torch.uint8, device="cuda")
    with pytest.raises(RuntimeError, match="16-byte aligned rows"):
        ops.grouped_gemm(a, w, offsets, out, w_scales=scales)


def test_rounded_weights_are_the_reference_values():
    """mxfp8_weights.round_pair (kernel.mxfp8_weights: rounded): each orientation bit for bit
    the reference quantizer's values (mxfp8.fake_quantize along K for forward, along the
    weight's rows for dgrad, stored transposed as the codes are), odd sizes, blocks far apart
    in scale, NaN where a NaN or Inf block is."""
    from mok_megatron.cuda import mxfp8_weights as mw

    g = torch.Generator(device="cuda").manual_seed(11)
    w1 = torch.randn(3, 96, 200, device="cuda", generator=g) * 0.05
    w2 = torch.randn(3, 200, 48, device="cuda", generator=g)
    w1[1, :, :40] *= 2.0 ** 40
    w1[2, 5, 7] = float("nan")
    w2[0, 33, 3] = float("inf")
    w2[2, :64, :] *= 2.0 ** -100
    w1, w2 = w1.bfloat16(), w2.bfloat16()
    r = mw.round_pair(w1, w2, gated=True)
    for name, got, w, dim in (("w1", r.w1, w1, 2), ("w2", r.w2, w2, 2),
                              ("w1_t", r.w1_t, w1, 1), ("w2_t", r.w2_t, w2, 1)):
        want = mxfp8.fake_quantize(w.float().cpu(), dim=dim).bfloat16()
        if dim == 1:
            want = want.transpose(1, 2).contiguous()
        assert got.shape == want.shape and got.dtype == torch.bfloat16, name
        _assert_same(got.cpu(), want, name)


def _same_codes(a, b) -> bool:
    return (torch.equal(a.codes.cpu().view(torch.uint8), b.codes.cpu().view(torch.uint8))
            and torch.equal(a.scales, b.scales))


def test_weight_cache_quantizes_once_per_step():
    """layer_weights hands back the same codes until an optimizer steps, the weights change
    in place, or weights_changed() is called; under CUDA-graph capture it never caches."""
    from mok_megatron.cuda import mxfp8_weights as mw

    g = torch.Generator(device="cuda").manual_seed(5)
    w1 = torch.randn(3, 128, 64, device="cuda", generator=g).to(torch.bfloat16)
    w2 = torch.randn(3, 64, 64, device="cuda", generator=g).to(torch.bfloat16)
    w1.requires_grad_()
    w2.requires_grad_()

    def get():
        return mw.layer_weights(w1, w1, w2, w1._version + w2._version, gated=False)

    first = get()
    assert get() is first
    # An in-place update bumps the version counter.
    with torch.no_grad():
        w1.mul_(2)
    second = get()
    assert second is not first
    assert _same_codes(second.w1, mw.quantize_weight(w1.detach()))
    # A write through .data bumps nothing: an optimizer step (any) or weights_changed() does.
    w2.data.mul_(3)
    assert get() is second
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1).step()
    third = get()
    assert third is not second
    assert _same_codes(third.w2_t, mw.quantize_weight_transposed(w2.detach()))
    assert not _same_codes(third.w2_t, second.w2_t)
    mw.weights_changed()
    fourth = get()
    assert fourth is not third and get() is fourth
    # Capture: quantized inside the graph, the cache entry left as it was.
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        get()  # warm-up on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            captured = get()
    assert captured is not fourth and get() is fourth
