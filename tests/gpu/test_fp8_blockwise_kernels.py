"""The blockwise FP8 recipe's kernels against its reference (mok_megatron/recipes/fp8_blockwise.py):
the 1 x 128 row quantizer and the 128 x 128 weight quantizer bit for bit, and the FP8 grouped
GEMM (csrc/gemm/fp8_grouped_gemm.cu) against the products of the dequantized operands in
fp32, rounded as the engine rounds.

Tolerance: the reference and the kernel multiply the same dequantized values (exact in bf16
and fp32) and differ only in fp32 summation order (the tensor cores sum each 128-long block,
the CUDA cores the blocks), so after the shared bf16 rounding of the output an element
differs by at most one bf16 ulp, and rarely: rel-L2 <= 2e-3 (the issue's bound is 5e-3).
"""

from __future__ import annotations

import pytest
import torch

from mok_megatron.recipes import fp8_blockwise
from mok_megatron.cuda import ops
from mok_megatron.recipes.fp8_blockwise import e8m0_values, engine_row_values, engine_weight_values
from mok_megatron.activations import get_activation

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

MAX_REL_L2 = 2e-3


def rel_l2(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def special_rows(rows: int, k: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, k, device="cuda", generator=g) * torch.exp2(
        torch.randint(-20, 20, (rows, 1), device="cuda", generator=g).float())
    x[0] = 0.0                                   # all-zero blocks
    x[1] = torch.randn(k, device="cuda", generator=g) * 2.0**-130  # subnormal inputs
    x[2, :] = 3.0
    x[2, 5] = 2.0**7                             # amax at a power of two
    x[3, 7] = 1e30                               # saturation of the rest of the block
    x[4, 130 % k] = float("nan")                 # a NaN block (only it)
    x[5, 3] = float("inf")
    return x.bfloat16()


@pytest.mark.parametrize("k", [128, 384, 208, 7168])
def test_row_quantizer_matches_reference(k):
    g = torch.Generator(device="cuda").manual_seed(k)
    x = special_rows(37, k, g)
    codes, scales_t = ops.fp8_quantize_rows(x)
    ref_codes, ref_scales = fp8_blockwise.quantize_rows(x.float().cpu())
    got_scales = e8m0_values(scales_t[:, :37]).t().cpu()
    assert torch.equal(got_scales.isnan(), ref_scales.isnan())
    finite = ~ref_scales.isnan()
    bad = finite & (got_scales != ref_scales)
    assert not bad.any(), (torch.nonzero(bad)[:4].tolist(), got_scales[bad][:4],
                           ref_scales[bad][:4])
    # Codes inside a NaN block may differ (every value of it dequantizes to NaN either way).
    ok = finite.repeat_interleave(128, dim=1)[:, :k]
    got_codes = codes.cpu().view(torch.uint8)
    assert torch.equal(got_codes[ok], ref_codes.view(torch.uint8)[ok])


@pytest.mark.parametrize("cols", [128, 208, 7168])
def test_quantize_round_both_is_rows_and_segments(cols):
    """One pass gives fp8_quantize_rows (codes and scale codes) and mx_round_segments with 128
    x 1 blocks bit for bit: segments shorter than a block, empty ones, a last short column
    block, NaN/Inf blocks; rows past the last segment are not written."""
    from test_mxfp8_kernels import _assert_same, _segmented

    counts = [0, 130, 1, 300, 0, 127, 900, 0]
    x, offsets = _segmented(counts, cols, seed=cols)
    n = int(offsets[-1])
    xc, oc = x.cuda(), offsets.cuda()
    (codes, scales), along_n = ops.fp8_quantize_round_both(xc, oc)
    want_codes, want_scales = ops.fp8_quantize_rows(xc)
    assert codes.shape == want_codes.shape and scales.shape == want_scales.shape
    assert torch.equal(codes[:n].view(torch.uint8), want_codes[:n].view(torch.uint8)), \
        "codes along K differ from fp8_quantize_rows"
    assert torch.equal(scales[:, :n], want_scales[:, :n]), "scale codes differ"
    _assert_same(along_n[:n].cpu(), ops.mx_round_segments(xc, oc, block=128)[:n].cpu(),
                 "along the rows vs segments")
    poison = torch.full_like(xc, float("nan"))
    ops.extension().fp8_quantize_round_both(xc, oc, codes, scales, poison)
    assert bool(poison[n:].isnan().all()), "rows past the last segment were written"


@pytest.mark.parametrize("shape", [(3, 256, 384), (2, 200, 136), (1, 96, 7168)])
def test_weight_quantizer_matches_reference(shape):
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    w = torch.randn(*shape, device="cuda", generator=g)
    w[0, :128, :128] *= 2.0**-128  # a block of bf16 subnormals and tiny normals
    w[-1, -1, -1] = float("nan")
    w = w.bfloat16()
    codes, scales = ops.fp8_quantize_weight_blocks(w)
    ref_codes, ref_scales = fp8_blockwise.quantize_weight(w.float().cpu())
    got = e8m0_values(scales).cpu()
    assert torch.equal(got.isnan(), ref_scales.isnan())
    assert torch.equal(got[~got.isnan()], ref_scales[~ref_scales.isnan()])
    ok = (~ref_scales.isnan()).repeat_interleave(128, 1).repeat_interleave(128, 2)
    ok = ok[:, :shape[1], :shape[2]]
    assert torch.equal(codes.cpu().view(torch.uint8)[ok], ref_codes.view(torch.uint8)[ok])


def grouped_case(counts, k, n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    E = len(counts)
    offsets = torch.zeros(E + 1, dtype=torch.int32)
    offsets[1:] = torch.tensor(counts).cumsum(0)
    rows = int(offsets[-1])
    a = (torch.randn(rows, k, device="cuda", generator=g)
         * torch.exp2(torch.randint(-4, 4, (rows, 1), device="cuda", generator=g).float()))
    w = torch.randn(E, n, k, device="cuda", generator=g) * k**-0.5
    w[:, : n // 3] *= 16.0  # weight blocks of different scales
    prob = torch.rand(rows, device="cuda", generator=g)
    return offsets.cuda(), a.bfloat16(), w.bfloat16(), prob


CASES = [  # (rows per expert, K, N)
    ([300, 0, 129, 64, 1], 256, 384),     # ragged, an empty expert, 1-row and 64-row experts
    ([128, 256], 7168, 256),              # DeepSeek's H: 56 blocks
    ([77, 500, 3], 208, 136),             # K and N not multiples of 128
    ([1000], 2048, 1536),
    ([64, 200], 128, 256),                # one k-block
    ([129, 70, 300], 640, 384),           # an odd number of k-blocks
]


@pytest.mark.parametrize("activation", [None, "swiglu", "squared_relu"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fp8_grouped_gemm_matches_reference(activation, case):
    counts, k, n = CASES[case]
    if activation == "swiglu":
        n = 2 * max(64, n // 128 * 64)  # gated halves: whole 64-row pieces
    offsets, a, w, prob = grouped_case(counts, k, n, seed=case)
    rows = a.shape[0]
    a_codes, a_scales = ops.fp8_quantize_rows(a)
    w_codes, w_scales = ops.fp8_quantize_weight_blocks(w)
    gated = activation == "swiglu"
    n_out = n // 2 if gated else n
    results = []
    # Three runs with the defaults, then other ring depths, tile orders and CTA pairs sharing
    # weight tiles (odd m-block groups: pairs across n-blocks, which share nothing): the same
    # bits.
    for stages, m_group, ctas in ((0, 0, 1), (0, 0, 1), (0, 0, 1), (5, 1, 1), (5, 3, 1),
                                  (6, 1000, 1), (0, 0, 2), (5, 3, 2), (6, 1, 2)):
        out = torch.full((rows + 5, n_out), float("nan"), device="cuda", dtype=torch.bfloat16)
        h = (torch.full((rows + 5, n), float("nan"), device="cuda", dtype=torch.bfloat16)
             if activation else None)
        ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, out,
                             activation=activation, row_prob=prob if activation else None,
                             h_out=h, stages=stages, m_group=m_group, cluster_ctas=ctas)
        results.append((out, h))
    bits = lambda t: t.view(torch.int16)  # noqa: E731 - the poison rows are NaN
    for out, h in results[1:]:  # bit-identical runs, whatever the ring and tile order
        assert torch.equal(bits(out), bits(results[0][0]))
        if h is not None:
            assert torch.equal(bits(h), bits(results[0][1]))
    out, h = results[0]
    assert out[rows:].isnan().all()  # rows outside the experts untouched
    av, wv = engine_row_values(a_codes, a_scales), engine_weight_values(w_codes, w_scales)
    ref = torch.cat([av[o0:o1] @ wv[e].t() for e, (o0, o1) in
                     enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist()))])
    if activation is None:
        assert rel_l2(out[:rows], ref.bfloat16()) <= MAX_REL_L2
        return
    ref_h = ref.bfloat16()
    assert rel_l2(h[:rows], ref_h) <= MAX_REL_L2
    act = get_activation(activation)
    ref_act = (act(ref_h.float()) * prob.unsqueeze(1)).bfloat16()
    assert rel_l2(out[:rows], ref_act) <= MAX_REL_L2


@pytest.mark.parametrize("activation", [None, "swiglu"])
def test_fp8_grouped_gemm_special_scale_codes(activation):
    """Scale codes 0 (all-zero and tiny row blocks, a tiny weight block: 2^-127, a subnormal
    factor) and 255 (a NaN row block, a NaN weight block), which an exponent-field shortcut
    for the scale products (2026-12-05, measured no faster and removed; docs/perf-log.md Blockwise FP8) would get wrong: the
    outputs match the reference, NaN exactly where the reference has them."""
    counts, k, n = [200, 77], 640, 512
    offsets, a, w, prob = grouped_case(counts, k, n, seed=11)
    a, w = a.float(), w.float()
    a[0] = 0.0
    a[1] *= 2.0**-124  # amax ~2^-122: the exponent clamps at -127 (code 0), codes nonzero
    a[2, 5] = float("nan")
    a[130:140, 128:256] = 0.0
    w[0, :128, :128] *= 2.0**-128
    w[1, 128:256, 256:384] = float("nan")
    a, w = a.bfloat16(), w.bfloat16()
    a_codes, a_scales = ops.fp8_quantize_rows(a)
    w_codes, w_scales = ops.fp8_quantize_weight_blocks(w)
    assert (a_scales == 0).any() and (a_scales == 255).any()
    assert (w_scales == 0).any() and (w_scales == 255).any()
    rows = a.shape[0]
    n_out = n // 2 if activation else n
    outs = []
    for _ in range(2):
        out = torch.full((rows, n_out), float("nan"), device="cuda", dtype=torch.bfloat16)
        h = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, out,
                             activation=activation, row_prob=prob if activation else None,
                             h_out=h if activation else None)
        outs.append((out, h))
    (out, h), (again, h_again) = outs
    assert torch.equal(out.view(torch.int16), again.view(torch.int16))
    assert torch.equal(h.view(torch.int16), h_again.view(torch.int16))
    av, wv = engine_row_values(a_codes, a_scales), engine_weight_values(w_codes, w_scales)
    ref = torch.cat([av[o0:o1] @ wv[e].t() for e, (o0, o1) in
                     enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist()))]).bfloat16()
    got = h if activation else out
    assert torch.equal(got.isnan(), ref.isnan())
    finite = ~ref.isnan()
    assert rel_l2(got[finite], ref[finite]) <= MAX_REL_L2
    tiny = ref[1, finite[1]]  # scaled by 2^-127: wrong (zero) if code 0 were taken as 0
    assert tiny.abs().max() > 0 and rel_l2(got[1, finite[1]], tiny) <= MAX_REL_L2


def test_fp8_grouped_gemm_agrees_with_bf16_engine_on_dequantized_operands():
    """The same products through the BF16 tile engine (dequantized operands are exact in
    bf16): only the summation order differs."""
    offsets, a, w, prob = grouped_case([640, 130, 0, 901], 1024, 512, seed=7)
    a_codes, a_scales = ops.fp8_quantize_rows(a)
    w_codes, w_scales = ops.fp8_quantize_weight_blocks(w)
    rows = a.shape[0]
    out = torch.empty(rows, 256, device="cuda", dtype=torch.bfloat16)
    ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, out,
                         activation="swiglu", row_prob=prob)
    ref = torch.empty_like(out)
    ops.grouped_gemm(engine_row_values(a_codes, a_scales).bfloat16(),
                     engine_weight_values(w_codes, w_scales).bfloat16(), offsets, ref,
                     activation="swiglu", row_prob=prob)
    assert rel_l2(out, ref) <= MAX_REL_L2


def test_fp8_grouped_gemm_rejects_bad_input():
    offsets, a, w, _ = grouped_case([10], 256, 256, seed=1)
    a_codes, a_scales = ops.fp8_quantize_rows(a)
    w_codes, w_scales = ops.fp8_quantize_weight_blocks(w)
    out = torch.empty(10, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="w_scales"):
        ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales[:, :1].contiguous(), offsets,
                             out)
    with pytest.raises(RuntimeError, match="64-row"):
        w96 = torch.empty(1, 192, 256, device="cuda").bfloat16()
        c96, s96 = ops.fp8_quantize_weight_blocks(w96)
        ops.fp8_grouped_gemm(a_codes, a_scales, c96, s96, offsets,
                             torch.empty(10, 96, device="cuda", dtype=torch.bfloat16),
                             activation="swiglu", row_prob=torch.ones(10, device="cuda"))
    with pytest.raises(RuntimeError, match="cluster_ctas"):
        ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, out, cluster_ctas=4)
    for stages in (4, 7):
        with pytest.raises(RuntimeError, match="stages must be"):
            ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, out,
                                 stages=stages)
    with pytest.raises(RuntimeError, match="m_group"):
        ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, out, m_group=-1)
    # The consumer's k-loop runs at least one block: K = 0 is refused, not run.
    with pytest.raises(RuntimeError, match="K must be positive"):
        ops.fp8_grouped_gemm(torch.empty(10, 0, device="cuda", dtype=torch.float8_e4m3fn),
                             torch.empty(0, 16, device="cuda", dtype=torch.uint8),
                             torch.empty(1, 256, 0, device="cuda", dtype=torch.float8_e4m3fn),
                             torch.empty(1, 2, 0, device="cuda", dtype=torch.uint8), offsets, out)
    # 6 stages fit beside at most 47 experts' tables; 256 experts get 5 by default.
    many = torch.zeros(257, dtype=torch.int32, device="cuda")
    many[1:] = 10
    w256 = torch.zeros(256, 256, 256, device="cuda").to(torch.float8_e4m3fn)
    s256 = torch.full((256, 2, 2), 127, dtype=torch.uint8, device="cuda")
    with pytest.raises(RuntimeError, match="do not fit"):
        ops.fp8_grouped_gemm(a_codes, a_scales, w256, s256, many, out, stages=6)


# The plain epilogue's 192-column tiles (block_n): N not a multiple of 192 (a last tile of 128
# or 64 columns), tiles starting inside a weight-scale block (n0 % 128 == 64), experts with 0
# and with fewer than 128 rows.
WIDE_CASES = CASES + [
    ([300, 0, 129, 64, 1], 512, 512),    # two wide tiles and a 128-column one
    ([5, 700, 0, 131], 1024, 1536),      # eight wide tiles: every other one starts mid-block
    ([1000, 17], 384, 200),              # a wide tile and an 8-column one
]


def block_scaled_case(counts, k, n, seed):
    """grouped_case quantized, each 128-row weight block scaled by its own power of two first
    (a tile reading a block's rows with another block's scale gives other bits): offsets,
    prob, rows and the operands' codes and scale codes."""
    offsets, a, w, prob = grouped_case(counts, k, n, seed)
    block_factor = torch.exp2(torch.arange(-(-n // 128), device="cuda").float() % 7 - 3)
    w = (w.float() * block_factor.repeat_interleave(128)[:n].view(1, n, 1)).bfloat16()
    a_codes, a_scales = ops.fp8_quantize_rows(a)
    w_codes, w_scales = ops.fp8_quantize_weight_blocks(w)
    assert w_scales.unique().numel() > 1
    return offsets, prob, a.shape[0], a_codes, a_scales, w_codes, w_scales


# (block_n, m_group, cluster_ctas): the 128 tiles, then the wide ones twice, in other tile
# orders and as CTA pairs (odd groups: pairs across n-blocks, which share no weight tile).
WIDE_RUNS = [(128, 0, 1), (192, 0, 1), (192, 0, 1), (192, 1, 1), (192, 1000, 1), (192, 0, 2),
             (192, 3, 2)]


@pytest.mark.parametrize("case", range(len(WIDE_CASES)))
def test_fp8_grouped_gemm_wide_tiles_give_the_128_tiles_bits(case):
    """block_n=192 (plain epilogue): bit for bit the 128-column tiles' output on every weight
    block layout, whose 128-row blocks each get their own scale here (a wrong block choice at
    a tile's second block changes the bits), whatever the tile order, alone or as CTA pairs;
    poison rows untouched."""
    counts, k, n = WIDE_CASES[case]
    offsets, _, rows, a_codes, a_scales, w_codes, w_scales = block_scaled_case(
        counts, k, n, seed=100 + case)
    outs = {}
    for block_n, m_group, ctas in WIDE_RUNS:
        out = torch.full((rows + 5, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, out,
                             block_n=block_n, m_group=m_group, cluster_ctas=ctas)
        outs.setdefault(block_n, []).append(out)
    want = outs[128][0].view(torch.int16)
    for out in outs[192]:
        assert torch.equal(out.view(torch.int16), want)
        assert out[rows:].isnan().all()


# The activation epilogues on 192-column tiles: a gated tile takes 96 gate and 96 up weight
# rows, each half spanning one or two 128-row scale blocks, its 96 output columns stored as
# three 32-column boxes. F not a multiple of 96 (a last tile of 32 or 64 columns), F % 128 ==
# 64 (the up half's blocks start mid-block, not where the gate half's do), experts with 0 and
# with fewer than 64 rows (the copied-out partial blocks).
WIDE_ACTIVATION_CASES = [  # (rows per expert, K, F)
    ([300, 0, 129, 64, 1], 256, 192),
    ([5, 700, 0, 131], 384, 320),       # F % 128 == 64, F % 96 == 32
    ([1000, 17], 7168, 2048),           # DeepSeek's H and F: 22 tiles, the last of 32 columns
    ([77, 500, 3], 208, 768),           # K not a multiple of 128; Qwen's F: 8 whole tiles
]


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "squared_relu"])
@pytest.mark.parametrize("case", range(len(WIDE_ACTIVATION_CASES)))
def test_fp8_grouped_gemm_wide_activation_tiles_give_the_128_tiles_bits(activation, case):
    """block_n=192 with an activation epilogue: out and h bit for bit the 128-column tiles'
    (every 128-row weight block has its own scale: a wrong block for any 32-row group of
    either half changes the bits), whatever the tile order, alone or as CTA pairs; poison
    rows untouched."""
    counts, k, f = WIDE_ACTIVATION_CASES[case]
    gated = activation in ("swiglu", "geglu")
    n = 2 * f if gated else f
    offsets, prob, rows, a_codes, a_scales, w_codes, w_scales = block_scaled_case(
        counts, k, n, seed=200 + case)
    outs = {}
    for block_n, m_group, ctas in WIDE_RUNS:
        out = torch.full((rows + 5, f), float("nan"), device="cuda", dtype=torch.bfloat16)
        h = torch.full((rows + 5, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, out,
                             activation=activation, row_prob=prob, h_out=h, block_n=block_n,
                             m_group=m_group, cluster_ctas=ctas)
        outs.setdefault(block_n, []).append((out, h))
    bits = lambda t: t.view(torch.int16)  # noqa: E731 - the poison rows are NaN
    want_out, want_h = outs[128][0]
    assert not want_out[:rows].isnan().any()
    for out, h in outs[192]:
        assert torch.equal(bits(out), bits(want_out))
        assert torch.equal(bits(h), bits(want_h))
        assert out[rows:].isnan().all() and h[rows:].isnan().all()


def test_fp8_grouped_gemm_wide_tiles_refuse_what_they_do_not_run():
    offsets, a, w, prob = grouped_case([100, 30], 256, 384, seed=3)
    a_codes, a_scales = ops.fp8_quantize_rows(a)
    w_codes, w_scales = ops.fp8_quantize_weight_blocks(w)
    plain = torch.empty(130, 384, device="cuda", dtype=torch.bfloat16)
    wide = ops.FP8_WIDE_BLOCK_N
    with pytest.raises(RuntimeError, match="block_n must be"):
        ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, plain, block_n=64)
    for stages in (5, 6):
        with pytest.raises(RuntimeError, match="192-column tiles run 4 stages"):
            ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, plain,
                                 block_n=wide, stages=stages)


@pytest.mark.parametrize("case", range(len(WIDE_ACTIVATION_CASES)))
def test_fp8_grouped_gemm_plain_product_is_the_gated_epilogues_h(case):
    """The separate backward recomputes h as the plain product on W1's codes (operands.py:
    Fp8BlockwiseOperands.fc1_past): bit for bit the h a gated epilogue writes beside act,
    on 128- and 192-column tiles."""
    counts, k, f = WIDE_ACTIVATION_CASES[case]
    offsets, prob, rows, a_codes, a_scales, w_codes, w_scales = block_scaled_case(
        counts, k, 2 * f, seed=300 + case)
    act = torch.empty(rows, f, device="cuda", dtype=torch.bfloat16)
    h = torch.full((rows, 2 * f), float("nan"), device="cuda", dtype=torch.bfloat16)
    ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, act,
                         activation="swiglu", row_prob=prob, h_out=h)
    assert not h.isnan().any()
    for block_n in (128, 192):
        plain = torch.full_like(h, float("nan"))
        ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets, plain,
                             block_n=block_n)
        assert torch.equal(plain.view(torch.int16), h.view(torch.int16))
