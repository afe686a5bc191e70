"""The MXFP8 reference quantizer (mok_megatron/mxfp8.py) against an independent scalar
implementation of the same rules (math.frexp, the E4M3 grid enumerated), on random blocks and
on the edge cases its docstring documents."""

import math
import random

import pytest
import torch

from mok_megatron import mxfp8


def _e4m3_grid() -> list[float]:
    """Every finite non-negative E4M3 (fn) value: subnormals m/8 * 2^-6, normals
    (1 + m/8) * 2^(e-7) for biased e in 1..15, without the NaN encoding (e=15, m=7)."""
    values = [m / 8 * 2.0**-6 for m in range(8)]
    for e in range(1, 16):
        for m in range(8):
            if e == 15 and m == 7:
                continue
            values.append((1 + m / 8) * 2.0 ** (e - 7))
    return sorted(values)


GRID = _e4m3_grid()


def _round_e4m3(v: float) -> float:
    """Nearest E4M3 value to v, ties to the even mantissa, saturating at 448."""
    a = min(abs(v), 448.0)
    hi = next(i for i, g in enumerate(GRID) if g >= a)
    if GRID[hi] == a or hi == 0:
        r = GRID[hi]
    else:
        lo_v, hi_v = GRID[hi - 1], GRID[hi]
        if a - lo_v < hi_v - a:
            r = lo_v
        elif hi_v - a < a - lo_v:
            r = hi_v
        else:  # a tie: the even code (the grid index parity is the mantissa's lowest bit)
            r = lo_v if (hi - 1) % 2 == 0 else hi_v
    return math.copysign(r, v)


def _scalar_block(values: list[float]) -> tuple[int, list[float]]:
    """(E8M0 code, dequantized values) of one block by the documented rules."""
    if any(not math.isfinite(v) for v in values):
        return 255, [math.nan] * len(values)
    amax = max(abs(v) for v in values)
    s = torch.tensor(amax, dtype=torch.float32) * torch.tensor(1 / 448, dtype=torch.float32)
    s = float(s)
    if s == 0.0 or s < 2.0**-126:
        e = -127
    else:
        m, ex = math.frexp(s)  # s = m * 2^ex, m in [0.5, 1)
        e = ex - 1 if m == 0.5 else ex
    e = max(-127, min(127, e))
    return e + 127, [_round_e4m3(float(torch.tensor(v, dtype=torch.float32)) * 2.0**-e) * 2.0**e
                     for v in values]


def _check(x: torch.Tensor, dim: int = -1) -> None:
    q, codes = mxfp8.quantize(x, dim)
    got = mxfp8.dequantize(q, codes, dim)
    rows = x.movedim(dim, -1).reshape(-1, x.shape[dim]).tolist()
    got_rows = got.movedim(dim, -1).reshape(-1, x.shape[dim]).tolist()
    code_rows = codes.movedim(dim, -1).reshape(-1, codes.shape[dim]).tolist()
    for row, got_row, code_row in zip(rows, got_rows, code_rows):
        for b in range(0, len(row), mxfp8.BLOCK):
            code, want = _scalar_block(row[b:b + mxfp8.BLOCK])
            assert code_row[b // mxfp8.BLOCK] == code, (row[b:b + mxfp8.BLOCK], code)
            for w, g in zip(want, got_row[b:b + mxfp8.BLOCK]):
                same = w == g and math.copysign(1, w) == math.copysign(1, g)
                assert (math.isnan(w) and math.isnan(g)) or same, (w, g)


@pytest.mark.parametrize("dim", [-1, 0])
def test_random_blocks_match_scalar_rules(dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 72, generator=g) * torch.logspace(-6, 6, 72).view(1, 72)
    _check(x.bfloat16().float(), dim)  # 72 = 2 whole blocks + a short one along dim -1


def test_edge_cases():
    block = [0.0] * 32
    zeros = torch.tensor([block, [-0.0] * 32])
    _check(zeros)
    q, codes = mxfp8.quantize(zeros)
    assert codes.tolist() == [[0], [0]]  # e = -127
    powers = torch.tensor([[448.0 * 2.0**k] + [1.0] * 31 for k in (-3, 0, 5)])  # amax/448 = 2^k
    _check(powers)
    assert mxfp8.quantize(powers)[1].view(-1).tolist() == [124, 127, 132]
    sub = torch.tensor([[2.0**-140 * (i + 1) for i in range(32)]])  # fp32 subnormals
    _check(sub)
    rnd = torch.tensor([[448.0 * 1.0000001] + [random.Random(1).uniform(-1, 1)] * 31])
    _check(rnd)  # just above 448: the scale steps up, nothing saturates
    special = torch.tensor([[float("nan")] + [1.0] * 31, [float("inf")] + [2.0] * 31,
                            [3.0] * 32])
    _check(special)
    got = mxfp8.fake_quantize(special)
    assert got[:2].isnan().all() and got[2].eq(3.0).all()  # the NaN stays in its block


def test_error_bound_and_no_saturation():
    """Every finite element is within half an E4M3 step: |dq - x| <= 2^-4 |x| for normals,
    and amax lands in (224, 448] after scaling."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 256, generator=g) * 10
    q, codes = mxfp8.quantize(x)
    dq = mxfp8.dequantize(q, codes)
    e = codes.to(torch.float32) - 127
    scaled_amax = x.view(64, 8, 32).abs().amax(-1) * torch.exp2(-e)
    assert (scaled_amax <= 448).all() and (scaled_amax > 224).all()
    normal = x.abs() >= 2.0**-6 * torch.exp2(e).repeat_interleave(32, dim=1)
    assert ((dq - x).abs()[normal] <= 2.0**-4 * x.abs()[normal]).all()
