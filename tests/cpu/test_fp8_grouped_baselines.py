"""The public kernels' operand layouts (scripts/fp8_grouped_baselines.py) against a per-expert
loop over our operands, and the ragged expert sizes scripts/bench_gemm.py --fp8-baselines
times them on: every expert's values land where CUTLASS's grouped blockwise mainloop and
DeepGEMM's contiguous layout read them."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import fp8_grouped_baselines as baselines  # noqa: E402
from bench_gemm import ragged_counts  # noqa: E402
from mok_megatron.recipes.fp8_blockwise import e8m0_values  # noqa: E402


def our_operands(counts, n=256, k=384, seed=0):
    """Codes and scale codes in ops.fp8_quantize_rows / fp8_quantize_weight_blocks' layouts
    (rows' scales transposed with rows padded to 16), offsets int32 [E + 1]."""
    g = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int32)
    offsets[1:] = torch.tensor(counts).cumsum(0)
    rows = int(offsets[-1])
    a_codes = torch.randint(0, 256, (rows, k), generator=g, dtype=torch.uint8)
    a_codes[a_codes.bitwise_and(0x7F) == 0x7F] = 0  # no NaN codes: compared with ==
    a_scale_codes = torch.randint(100, 150, (k // 128, -(-rows // 16) * 16), generator=g,
                                  dtype=torch.uint8)
    w_scale_codes = torch.randint(100, 150, (len(counts), n // 128, k // 128), generator=g,
                                  dtype=torch.uint8)
    return a_codes.view(torch.float8_e4m3fn), a_scale_codes, w_scale_codes, offsets


COUNTS = [0, 100, 300, 0, 128, 1, 257]


def test_cutlass_scales_per_expert():
    _, a_sc, w_sc, offsets = our_operands(COUNTS)
    a_scales, w_scales = baselines.cutlass_operands(a_sc, w_sc, offsets)
    kb = a_sc.shape[0]
    assert a_scales.numel() == kb * int(offsets[-1])
    for e, m in enumerate(COUNTS):
        first = int(offsets[e])
        block = a_scales[kb * first: kb * (first + m)].view(kb, m)  # M-major [K/128, m_e]
        assert torch.equal(block, e8m0_values(a_sc[:, first:first + m]))
        # B's N-major [K/128, N/128] at e * N/128 * K/128 of the flat tensor.
        flat = w_scales.flatten()[e * w_sc[e].numel():(e + 1) * w_sc[e].numel()]
        assert torch.equal(flat.view(kb, -1), e8m0_values(w_sc[e]).t())


def test_deepgemm_contiguous_layout():
    a_codes, a_sc, w_sc, offsets = our_operands(COUNTS)
    ops_ = baselines.deepgemm_operands(a_codes, a_sc, w_sc, offsets)
    a = ops_.a.view(torch.uint8)
    kb = a_sc.shape[0]
    total = a.shape[0]
    start = 0
    for e, m in enumerate(COUNTS):
        first = int(offsets[e])
        assert start % 128 == 0
        assert torch.equal(a[start:start + m], a_codes[first:first + m].view(torch.uint8))
        assert torch.equal(ops_.rows[first:first + m], torch.arange(start, start + m))
        assert (ops_.grouped_layout[start:start + m] == e).all()
        padded = -(-m // 128) * 128
        assert (a[start + m:start + padded] == 0).all()
        assert (ops_.grouped_layout[start + m:start + padded] == -1).all()
        assert torch.equal(ops_.a_scales[start:start + m], e8m0_values(a_sc[:, first:first + m]).t())
        start += padded
    assert start == total == ops_.grouped_layout.numel()
    # DeepGEMM's sm90 activation scales: [rows, K/128], M-major, column stride padded to 16 B.
    assert ops_.a_scales.shape == (total, kb)
    assert ops_.a_scales.stride() == (1, -(-total // 4) * 4)
    assert ops_.w_scales.is_contiguous() and torch.equal(ops_.w_scales, e8m0_values(w_sc))


@pytest.mark.parametrize("experts", [8, 32, 128])
def test_ragged_counts(experts):
    rows = 4096 * 8
    counts = ragged_counts(rows, experts, seed=0)
    assert int(counts.sum()) == rows and (counts >= 0).all()
    assert counts[0] == 0 and 0 < counts[1] < 128
    assert (counts % 128 != 0).sum() > experts // 2
    assert torch.equal(counts, ragged_counts(rows, experts, seed=0))


def test_dequantized_product_per_expert():
    """bench_gemm's reference: every expert's rows times its own dequantized weight, empty
    experts included, against a float64 loop."""
    from bench_gemm import dequantized_product
    from mok_megatron.recipes.fp8_blockwise import engine_row_values, engine_weight_values

    counts = torch.tensor([0, 3, 0, 5, 1])
    n, k = 256, 384
    g = torch.Generator().manual_seed(1)
    rows = int(counts.sum())
    a_codes = (torch.randn(rows, k, generator=g) * 8).to(torch.float8_e4m3fn)
    a_sc = torch.randint(120, 130, (k // 128, 16), generator=g, dtype=torch.uint8)
    w_codes = (torch.randn(len(counts), n, k, generator=g) * 8).to(torch.float8_e4m3fn)
    w_sc = torch.randint(120, 130, (len(counts), n // 128, k // 128), generator=g,
                         dtype=torch.uint8)
    got = dequantized_product(a_codes, a_sc, w_codes, w_sc, counts)
    a = engine_row_values(a_codes, a_sc).double()
    w = engine_weight_values(w_codes, w_sc).double()
    expert = torch.repeat_interleave(torch.arange(len(counts)), counts)
    want = torch.einsum("rk,rnk->rn", a, w[expert])
    assert torch.allclose(got.double(), want, rtol=1e-2, atol=1e-2)


class FakeCutlass:
    """Variants whose launches take the given seconds; 'bad' refuses the problem."""
    SECONDS = {"slow": 3.0, "fast": 1.0, "bad": None}

    def variants(self):
        return list(self.SECONDS)

    def prepare(self, variant, *args):
        if self.SECONDS[variant] is None:
            raise RuntimeError("cutlass_fp8_grouped: can_implement refused the problem")
        launch = lambda: None  # noqa: E731
        launch.seconds = self.SECONDS[variant] + args[-2] * 0.1  # raster order
        return launch


def test_cutlass_launch_takes_the_fastest(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    a_codes, a_sc, w_sc, offsets = our_operands([0, 100, 300])
    w_codes = torch.zeros(3, 256, 384, dtype=torch.float8_e4m3fn)
    out = torch.empty(400, 256, dtype=torch.bfloat16)
    launch, name, tried = baselines.cutlass_launch(FakeCutlass(), a_codes, a_sc, w_codes, w_sc,
                                                   offsets, out, lambda fn: fn.seconds)
    assert name == "fast/heuristic" and launch.seconds == 1.0
    assert tried["bad/along_n"].startswith("refused") and tried["slow/along_m"] == 3.1
