"""The blockwise FP8 reference (mok_megatron/recipes/fp8_blockwise.py) against an independent scalar
implementation of its documented rules (the scale from its definition, the E4M3 grid
enumerated), on random blocks and the edge cases its docstring lists; its expert MLP against
the formulas written out and against the BF16 recipe; the recipe file, the demo and the
refusals around it."""

import bisect
import dataclasses
import math

import pytest
import torch

from mok_megatron import config, demo
from mok_megatron.recipes import fp8_blockwise as fb
from mok_megatron.config import ConfigError, load_recipe
from mok_megatron.functional import resolve_backend
from mok_megatron.testing import expert_grads, expert_problem


def _e4m3_grid() -> list[float]:
    """The finite non-negative E4M3 (fn) values: subnormals m/8 * 2^-6, normals
    (1 + m/8) * 2^(e - 7) for biased e in 1..15, less the NaN encoding (e = 15, m = 7)."""
    values = [m / 8 * 2.0**-6 for m in range(8)]
    values += [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8)
               if (e, m) != (15, 7)]
    return sorted(values)


GRID = _e4m3_grid()


def _round_e4m3(v: float) -> float:
    """v (already within +-448) to the nearest E4M3 value, ties to the even code."""
    a = abs(v)
    i = bisect.bisect_left(GRID, a)
    if GRID[i] == a:
        return math.copysign(a, v)
    lo, hi = GRID[i - 1], GRID[i]
    # The grid index's parity is the code's lowest mantissa bit.
    r = lo if a - lo < hi - a or (a - lo == hi - a and (i - 1) % 2 == 0) else hi
    return math.copysign(r, v)


def _exponent(amax: float) -> int:
    """The documented e: the smallest with amax / 2^e <= 448, clamped to [-127, 127]."""
    e = -127
    while e < 127 and amax > 448.0 * 2.0**e:
        e += 1
    return e


def _scalar_block(values: list[float]) -> tuple[float, list[float]]:
    """(scale, dequantized values) of one block of fp32 values by the documented rules."""
    if not all(math.isfinite(v) for v in values):
        return math.nan, [math.nan] * len(values)
    e = _exponent(max(abs(v) for v in values))
    scaled = [max(-448.0, min(448.0, v * 2.0**-e)) for v in values]
    return 2.0**e, [_round_e4m3(s) * 2.0**e for s in scaled]


def _same(a: float, b: float) -> bool:
    """Equal as values and signs, or both NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


def _check_rows(x: torch.Tensor) -> None:
    """quantize_rows(x) of a 2-D fp32 x against the scalar rules, block by block."""
    codes, scales = fb.quantize_rows(x)
    got = fb.dequantize_rows(codes, scales)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == x.shape
    assert scales.dtype == torch.float32
    assert scales.shape == (x.shape[0], -(-x.shape[1] // fb.BLOCK))
    for r, row in enumerate(x.tolist()):
        for b in range(0, len(row), fb.BLOCK):
            scale, want = _scalar_block(row[b:b + fb.BLOCK])
            assert _same(scales[r, b // fb.BLOCK].item(), scale), (r, b)
            for w, g in zip(want, got[r, b:b + fb.BLOCK].tolist()):
                assert _same(w, g), (r, b, w, g)


def _check_weight(w: torch.Tensor) -> None:
    """quantize_weight(w) of a 2-D fp32 w against the scalar rules, tile by tile."""
    codes, scales = fb.quantize_weight(w)
    got = fb.dequantize_weight(codes, scales)
    n, k = w.shape
    assert scales.shape == (-(-n // fb.BLOCK), -(-k // fb.BLOCK))
    for i in range(0, n, fb.BLOCK):
        for j in range(0, k, fb.BLOCK):
            tile = w[i:i + fb.BLOCK, j:j + fb.BLOCK]
            scale, want = _scalar_block(tile.flatten().tolist())
            assert _same(scales[i // fb.BLOCK, j // fb.BLOCK].item(), scale), (i, j)
            for a, b in zip(want, got[i:i + fb.BLOCK, j:j + fb.BLOCK].flatten().tolist()):
                assert _same(a, b), (i, j, a, b)


def _random(shape, seed, low=-6.0, high=6.0) -> torch.Tensor:
    """bf16-valued fp32 samples with magnitudes spread over 10^low..10^high along dim -1."""
    g = torch.Generator().manual_seed(seed)
    spread = torch.logspace(low, high, shape[-1])
    return (torch.randn(*shape, generator=g) * spread).bfloat16().float()


# ---- the quantizers -----------------------------------------------------------------------

def test_random_rows_match_scalar_rules():
    _check_rows(_random((6, 300), seed=0))  # 300 = 2 whole blocks + 44


def test_rows_along_another_dim_are_rows_of_the_transpose():
    x = _random((300, 5), seed=1)
    codes, scales = fb.quantize_rows(x, dim=0)
    codes_t, scales_t = fb.quantize_rows(x.t())
    assert scales.shape == (3, 5)
    assert torch.equal(codes.view(torch.uint8), codes_t.t().view(torch.uint8))
    assert torch.equal(scales, scales_t.t())
    assert torch.equal(fb.fake_quantize_rows(x, 0), fb.fake_quantize_rows(x.t()).t())


def test_random_weight_blocks_match_scalar_rules():
    _check_weight(_random((200, 300), seed=2))  # edge tiles 72 x 128, 128 x 44 and 72 x 44


def test_weight_with_leading_dims_is_blocked_per_matrix():
    w = _random((2, 130, 140), seed=3)
    codes, scales = fb.quantize_weight(w)
    assert codes.shape == w.shape and scales.shape == (2, 2, 2)
    for e in range(2):
        c, s = fb.quantize_weight(w[e])
        assert torch.equal(codes[e].view(torch.uint8), c.view(torch.uint8))
        assert torch.equal(scales[e], s)


def test_transposed_weight_is_the_transposed_codes_and_scales():
    w = _random((200, 300), seed=4)
    w[5, 290] = float("nan")  # a NaN block transposes with the rest
    codes, scales = fb.quantize_weight(w)
    codes_t, scales_t = fb.quantize_weight(w.t())
    assert torch.equal(codes_t.view(torch.uint8), codes.t().view(torch.uint8))
    assert torch.equal(scales_t.isnan(), scales.t().isnan())
    assert torch.equal(scales_t.nan_to_num(), scales.t().nan_to_num())
    dq, dq_t = fb.fake_quantize_weight(w), fb.fake_quantize_weight(w.t())
    assert torch.equal(dq_t.isnan(), dq.t().isnan()) and dq.isnan().any()
    assert torch.equal(dq_t.nan_to_num(), dq.t().nan_to_num())


def test_zeros():
    zeros = torch.tensor([[0.0] * 128, [-0.0] * 128])
    _check_rows(zeros)
    codes, scales = fb.quantize_rows(zeros)
    assert scales.view(-1).tolist() == [2.0**-127] * 2  # e = -127
    got = fb.fake_quantize_rows(zeros)
    assert got.eq(0).all() and got[1].signbit().all() and not got[0].signbit().any()


def test_subnormal_inputs():
    sub = torch.tensor([[2.0**-140 * (i + 1) for i in range(128)]])  # fp32 subnormals
    _check_rows(sub)
    assert fb.quantize_rows(sub)[1].item() == 2.0**-127
    # Scaled by 2^127 they are k * 2^-13: below half E4M3's smallest step 2^-9 (k <= 8, 8 a tie
    # to the even 0) they round to 0.
    got = fb.fake_quantize_rows(sub)[0]
    assert got[:8].eq(0).all() and got[8:].ne(0).all()


def test_amax_at_a_power_of_two_keeps_its_exponent():
    rows = torch.tensor([[448.0 * 2.0**k] + [1.0] * 127 for k in (-3, 0, 5)])
    _check_rows(rows)
    assert fb.quantize_rows(rows)[1].view(-1).tolist() == [2.0**-3, 1.0, 2.0**5]
    # amax = 448 * 2^k: scaled exactly to 448, which E4M3 represents.
    assert torch.equal(fb.fake_quantize_rows(rows)[:, 0], rows[:, 0])
    just_above = torch.nextafter(torch.tensor(448.0), torch.tensor(1e9))
    above = torch.tensor([[just_above.item()] + [1.0] * 127])
    _check_rows(above)
    assert fb.quantize_rows(above)[1].item() == 2.0  # the scale steps up


def test_no_element_saturates_and_errors_stay_within_half_a_step():
    """After scaling, every finite block's amax lies in (224, 448] (nothing is clipped), and
    every normal element is within half an E4M3 step: |dq - x| <= 2^-4 |x|."""
    x = torch.randn(64, 384, generator=torch.Generator().manual_seed(5)) * 1e3
    codes, scales = fb.quantize_rows(x)
    scaled_amax = x.view(64, 3, 128).abs().amax(-1) / scales
    assert (scaled_amax <= 448).all() and (scaled_amax > 224).all()
    assert codes.float().abs().max() <= 448 and not codes.float().isnan().any()
    dq = fb.dequantize_rows(codes, scales)
    normal = x.abs() >= 2.0**-6 * scales.repeat_interleave(128, dim=1)
    assert ((dq - x).abs()[normal] <= 2.0**-4 * x.abs()[normal]).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_value_poisons_only_its_block(bad):
    x = _random((3, 300), seed=6, low=-1, high=1)
    x[1, 130] = bad
    _check_rows(x)
    scales = fb.quantize_rows(x)[1]
    assert scales.isnan().nonzero().tolist() == [[1, 1]]
    got = fb.fake_quantize_rows(x)
    assert got[1, 128:256].isnan().all()
    assert got.isnan().sum() == 128

    w = _random((200, 300), seed=7, low=-1, high=1)
    w[150, 20] = bad
    _check_weight(w)
    assert fb.quantize_weight(w)[1].isnan().nonzero().tolist() == [[1, 0]]
    got = fb.fake_quantize_weight(w)
    assert got[128:, :128].isnan().all() and got.isnan().sum() == 72 * 128


def test_a_short_last_block_takes_its_amax_from_its_own_elements():
    x = torch.full((1, 300), 0.01)
    x[0, 0] = 1000.0  # the first block's amax, far above the others'
    scales = fb.quantize_rows(x)[1]
    assert scales.view(-1).tolist() == [4.0, 2.0**-15, 2.0**-15]
    assert torch.equal(fb.fake_quantize_rows(x)[0, 256:], fb.fake_quantize_rows(x[:, 256:])[0])
    w = torch.full((200, 300), 0.01)
    w[0, 0] = 1000.0
    assert fb.quantize_weight(w)[1].tolist() == [[4.0, 2.0**-15, 2.0**-15]] + [[2.0**-15] * 3]


def test_dequantized_values_are_exact_in_bf16():
    """Power-of-two scales: every dequantized value of a finite input (blocks with e >= -124)
    is a bf16 value, rows and weights alike."""
    x = _random((16, 300), seed=8, low=-30, high=30)
    got = fb.fake_quantize_rows(x)
    assert not torch.equal(got, x)  # quantization did round
    assert torch.equal(got.bfloat16().float(), got)
    w = _random((200, 300), seed=9, low=-30, high=30)
    got = fb.fake_quantize_weight(w)
    assert torch.equal(got.bfloat16().float(), got)


# ---- wgrad's segments ---------------------------------------------------------------------

def test_segments_never_cross_into_the_next_expert():
    """Expert 0 has rows 0..99, expert 1 rows 100..299: blocks 0..99, 100..227 and a short
    228..299. The filler 1.125 is exact in E4M3 at its own scale and rounds to 0 in a block
    that holds 1e6 (row 120): blocks counted from row 0 instead (0..127, 128..255, ...) would
    zero expert 0's rows and keep rows 128..227 exact."""
    x = torch.full((300, 3), 1.125)
    x[120] = 1e6
    got = fb.fake_quantize_segments(x, torch.tensor([0, 100, 300]))
    assert torch.equal(got[:100], x[:100])
    assert got[100:120].eq(0).all() and got[121:228].eq(0).all()
    assert torch.equal(got[228:], x[228:])
    crossing = fb.fake_quantize_rows(x, dim=0)
    assert crossing[:100].eq(0).all() and torch.equal(crossing[128:228], x[128:228])


def test_segments_with_an_empty_expert_and_bad_offsets():
    x = _random((300, 4), seed=10)
    got = fb.fake_quantize_segments(x, torch.tensor([0, 100, 100, 300]))
    want = torch.cat([fb.fake_quantize_rows(x[:100], 0), fb.fake_quantize_rows(x[100:], 0)])
    assert torch.equal(got, want)
    for bad in ([0, 200, 100, 300], [0, 100], [1, 300]):
        with pytest.raises(ValueError, match="offsets must rise from 0 to the 300 rows"):
            fb.fake_quantize_segments(x, torch.tensor(bad))


# ---- the expert MLP -----------------------------------------------------------------------

def test_expert_mlp_follows_the_documented_formulas():
    """Each GEMM of fp8_blockwise.expert_mlp rewritten from its table with the operands
    quantized as stated (rows along H, F or F1, weights in 128x128 blocks, wgrad along the
    rows): the same bits, on CPU. Sizes off the block edges: 300 rows, H=200, F1=144."""
    x, w1, w2, p, do = expert_problem(300, 200, 72, seed=11)
    got = expert_grads(fb.expert_mlp, x, w1, w2, p, do)
    qr, qw = fb.fake_quantize_rows, fb.fake_quantize_weight
    bf = torch.bfloat16
    silu = torch.nn.functional.silu
    xd, w1d, w2d, pd = (t.detach() for t in (x, w1, w2, p))
    h = (qr(xd) @ qw(w1d).t()).to(bf)
    g, u = h.float().chunk(2, dim=1)
    a = (silu(g) * u * pd[:, None]).to(bf)
    y = (qr(a) @ qw(w2d).t()).to(bf)
    d_a = (qr(do) @ qw(w2d)).to(bf).float()
    s = torch.sigmoid(g)
    d_g = (d_a * pd[:, None] * u * s * (1 + g * (1 - s))).to(bf)
    d_u = (d_a * pd[:, None] * silu(g)).to(bf)
    d_h = torch.cat([d_g, d_u], dim=1)
    want = {"y": y, "dx": (qr(d_h) @ qw(w1d)).to(bf),
            "dw2": (qr(do, 0).t() @ qr(a, 0)).to(bf), "dw1": (qr(d_h, 0).t() @ qr(xd, 0)).to(bf),
            "dprobs": (d_a * (silu(g) * u)).sum(1)}
    # dprobs too: autograd sums dA * act(h) over F as written here.
    for name in ("y", "dx", "dw1", "dw2", "dprobs"):
        assert torch.equal(got[name], want[name]), name


def test_expert_mlp_against_bf16_within_the_recipe_bounds():
    """Against the BF16 recipe: sum|d| / sum|ref| <= 0.1 and gradient cosine >= 0.996, and
    the same bits on a second run."""
    from mok_megatron.reference.moe import expert_mlp as bf16_mlp

    problem = expert_problem(256, 256, 128, seed=13)
    ref = expert_grads(bf16_mlp, *problem)
    got = expert_grads(fb.expert_mlp, *problem)
    for name, r in ref.items():
        d, r = got[name].double(), r.double()
        assert float((d - r).abs().sum() / r.abs().sum()) <= 0.1, name
        cos = float(torch.nn.functional.cosine_similarity(d.flatten(), r.flatten(), dim=0))
        assert cos >= 0.996, (name, cos)
    again = expert_grads(fb.expert_mlp, *problem)
    assert all(torch.equal(again[n], got[n]) for n in got)


def test_expert_without_rows():
    x, w1, w2, p, do = expert_problem(0, 200, 72, seed=11)
    got = expert_grads(fb.expert_mlp, x, w1, w2, p, do)
    assert got["y"].shape == (0, 200) and got["dw1"].abs().sum() == 0


# ---- the recipe ---------------------------------------------------------------------------

def test_recipe_loads_with_auto_kernels():
    recipe = load_recipe("fp8_blockwise")
    assert recipe.precision == "fp8_blockwise" and recipe.backend == "auto"
    assert (recipe.kernel.forward_kernel, recipe.kernel.backward_kernel) == ("auto",) * 2
    assert resolve_backend(recipe, torch.device("cpu")) == "reference"


@pytest.mark.parametrize("kernel, why", [
    ("forward_kernel", "the forward megakernel under fp8_blockwise pulls x rows quantized"),
    ("backward_kernel", "the backward megakernel under fp8_blockwise rounds the rows it pulls "
                        "in place")])
def test_megakernels_need_recomputed_inputs(tmp_path, kernel, why):
    """Either megakernel runs the recipe (the forward one's pull keeps x's codes, which
    backward's weight gradient cannot start from; the backward one rounds the rows it pulls in
    place): with recomputed backward inputs it loads, with saved ones it is refused by name."""
    path = tmp_path / "blockwise.yaml"
    path.write_text(f"precision: fp8_blockwise\nkernel:\n  {kernel}: megakernel\n")
    assert getattr(load_recipe(str(path)).kernel, kernel) == "megakernel"
    path.write_text(f"precision: fp8_blockwise\nkernel:\n  {kernel}: megakernel\n"
                    "  backward_inputs: saved\n")
    with pytest.raises(ConfigError, match=f"kernel.backward_inputs: {why}.* set it to "
                                          f"recomputed"):
        load_recipe(str(path))


def test_the_cuda_backend_refuses_it_without_kernels(monkeypatch):
    """Where config.CUDA_PRECISIONS does not list it (before its kernels land), a call that
    would reach the kernels is refused, naming the recipe - never run as another precision;
    the reference backend takes it on any device."""
    from mok_megatron import functional

    monkeypatch.setattr(functional, "CUDA_PRECISIONS", ("bf16", "mxfp8"))
    recipe = load_recipe("fp8_blockwise")
    with pytest.raises(NotImplementedError, match="recipe 'fp8_blockwise': precision "
                                                  "fp8_blockwise has no CUDA kernels yet"):
        resolve_backend(recipe, torch.device("cuda"))
    reference = dataclasses.replace(recipe, backend="reference")
    assert resolve_backend(reference, torch.device("cuda")) == "reference"
    assert resolve_backend(load_recipe("mxfp8"), torch.device("cuda")) == "cuda"


@pytest.mark.parametrize("have_te", [True, False])
def test_cli_says_which_megatron_args_it_took(capsys, monkeypatch, have_te):
    monkeypatch.setattr(config, "transformer_engine_installed", lambda: have_te)
    assert config.main(["--recipe", "fp8_blockwise", "--dispatcher", "mok", "--model",
                        "tiny"]) == 0
    out, err = capsys.readouterr()
    assert ("--fp8-format e4m3 --fp8-recipe blockwise" in out) == have_te and "--bf16" in out
    assert err.strip() == ("recipe 'fp8_blockwise': with Transformer Engine: "
                           "megatron_args_with_te" if have_te else
                           "recipe 'fp8_blockwise': without Transformer Engine: megatron_args")


def test_demo_runs_the_recipe_on_cpu(capsys, monkeypatch):
    """`--recipe fp8_blockwise` runs the reference's blockwise experts and meets the FP8
    bound against the float64 loop."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert demo.main(["--recipe", "fp8_blockwise"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "fp8_blockwise experts" in out and "sum|d|/sum|ref|" in out


def test_e8m0_values_are_exact_powers_of_two():
    """The kernels' scale codes back to values: 2^(c - 127) for every code (2^-127 is an fp32
    subnormal), NaN for 255."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = fb.e8m0_values(codes)
    want = torch.tensor([2.0 ** (c - 127) for c in range(255)], dtype=torch.float64)
    assert torch.equal(got[:255].double(), want)
    assert got[255].isnan()
