"""scripts/bench_moe.py's roofline: the FLOPs the layer must do (6 rows H F forward for SwiGLU,
4 for a plain activation, backward twice forward, never the recomputed FC1), the three terms
and which binds."""

import dataclasses
import sys
from pathlib import Path

import pytest

from mok_megatron.config import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_moe  # noqa: E402

PEAKS = {"grouped_gemm_flops": 600e12, "hbm_bytes_per_s": 3e12, "nvlink_bytes_per_s": 300e9}


@pytest.mark.parametrize("gated, per_row", [(True, 6), (False, 4)])
def test_layer_flops_forward_and_backward(gated, per_row):
    rows, H, F = 1000, 64, 48
    assert bench_moe.layer_flops(rows, H, F, gated, backward=False) == per_row * rows * H * F
    # Backward: dgrad and wgrad of each GEMM, twice forward; fwd+bwd three times forward.
    assert bench_moe.layer_flops(rows, H, F, gated, backward=True) == 3 * per_row * rows * H * F


def test_roofline_counts_required_flops_only():
    """Qwen3-30B-A3B-like at T=4096 on one GPU: 32768 routed rows; the floor's FLOPs are the
    layer's (18 rows H F for fwd+bwd) whatever a setting recomputes, and the tensor term is
    them at the grouped-GEMM rate."""
    model = load_model("qwen3_30b_a3b_like")
    rows, H, F = 4096 * 8, 2048, 768
    fwd = bench_moe.roofline(model, rows, 0, 128, PEAKS, backward=False)
    both = bench_moe.roofline(model, rows, 0, 128, PEAKS, backward=True)
    assert fwd["flops"] == 6 * rows * H * F
    assert both["flops"] == 18 * rows * H * F
    assert both["terms_s"]["tensor"] == pytest.approx(18 * rows * H * F / 600e12)
    assert fwd["terms_s"]["nvlink"] == 0.0  # one GPU: no row leaves it
    assert both["floor_s"] == max(both["terms_s"].values())
    assert both["binding"] == max(both["terms_s"], key=both["terms_s"].get)


def test_roofline_hbm_and_nvlink_terms():
    """The terms kept from before: weights read once per pass (and the weight gradients
    written in backward), bf16 activations x, h, act, y written and read, rows over NVLink
    both ways."""
    model = load_model("deepseek_v3_like")
    rows, remote, local, H, F = 4096, 2000, 128, 7168, 2048
    weights = local * 3 * H * F * 2
    acts = rows * (2 * H + 4 * F + 2 * F) * 2
    fwd = bench_moe.roofline(model, rows, remote, local, PEAKS, backward=False)
    both = bench_moe.roofline(model, rows, remote, local, PEAKS, backward=True)
    assert fwd["terms_s"]["hbm"] == pytest.approx((weights + acts) / 3e12)
    assert both["terms_s"]["hbm"] == pytest.approx((3 * weights + 2 * acts) / 3e12)
    assert fwd["terms_s"]["nvlink"] == pytest.approx(2 * remote * H * 2 / 300e9)
    assert both["terms_s"]["nvlink"] == pytest.approx(4 * remote * H * 2 / 300e9)
    # 128 experts' weights (11 GB) for 512 tokens' rows: reading them binds, not the MMAs.
    assert both["binding"] == "hbm"


def test_roofline_of_a_plain_activation():
    """A non-gated activation's FC1 has F rows, not 2F: fewer FLOPs and weight bytes."""
    model = dataclasses.replace(load_model("tiny"), activation="gelu")
    rows, H, F = 512, 64, 32
    roof = bench_moe.roofline(model, rows, 0, 8, PEAKS, backward=True)
    assert roof["flops"] == 12 * rows * H * F
    weights = 8 * 2 * H * F * 2
    acts = rows * (2 * H + 2 * F + 2 * F) * 2
    assert roof["terms_s"]["hbm"] == pytest.approx((3 * weights + 2 * acts) / 3e12)
