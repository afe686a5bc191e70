"""The sm90 grouped GEMM tile engine alone (EP=1, no communication), against torch._grouped_mm
plus the v1 activation kernel, and against a float64 oracle of the same bf16 inputs.

Tolerances: ours and torch both accumulate in fp32 and round the output to bf16, so they differ
by accumulation order plus bf16 rounding of the outputs (a few 1e-3 relative per element at
most, ~1e-3 in rel-L2); against the float64 oracle the bf16 rounding alone gives ~2e-3."""

import pytest
import torch

from mok_megatron.cuda import ops
from mok_megatron.activations import get_activation

pytestmark = pytest.mark.gpu

VS_TORCH = 3e-3
VS_FLOAT64 = 4e-3


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make(num_experts, rows_per_expert, k_dim, n_dim, cap_extra=37, seed=0, expert_pad=0):
    """A grouped problem: rows grouped by expert (some experts empty), the A buffer larger than
    the rows used (as v1's worst-case row buffer is), W possibly with padding between experts
    (a strided view, as a parameter buffer slice would be)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    counts = torch.tensor(rows_per_expert, dtype=torch.int64)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32)
    offsets[1:] = counts.cumsum(0).to(torch.int32)
    total = int(counts.sum())
    a = torch.randn(total + cap_extra, k_dim, device="cuda", generator=g).bfloat16()
    storage = torch.randn(num_experts, n_dim + expert_pad, k_dim, device="cuda", generator=g)
    w = (storage * k_dim**-0.5).bfloat16()[:, :n_dim, :]
    prob = torch.rand(total + cap_extra, device="cuda", generator=g)
    return a, w, offsets.cuda(), prob, total


def torch_fc(a, w, offsets, total):
    return torch._grouped_mm(a[:total], w.transpose(1, 2), offs=offsets[1:])


def oracle(a, w, offsets, total, prob=None, activation=None):
    """float64 per expert; FC1 output rounded to bf16 before the activation, as everywhere."""
    outs = []
    for e in range(w.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        h = (a[lo:hi].double() @ w[e].double().t()).bfloat16().double()
        if activation is not None:
            h = get_activation(activation)(h) * prob[lo:hi, None].double()
        outs.append(h)
    return torch.cat(outs)[:total]


CASES = {
    # name: (experts, rows per expert, K, N)
    "aligned": (4, [128, 256, 384, 128], 512, 512),
    "ragged": (6, [1, 0, 200, 77, 0, 300], 520, 264),  # K tail, N tail, empty experts
    "one_hot_expert": (8, [0, 0, 0, 1000, 0, 0, 0, 0], 256, 768),
    "many_small": (64, [3] * 64, 256, 256),
    # several tiles per block (each block's tile loop and stage ring wrap many times)
    "many_tiles": (8, [2000, 1500, 0, 1999, 64, 3000, 1, 1200], 512, 1024),
    # short last m-blocks (at most 64 rows: one warpgroup's worth) at 64 / 65 rows and after
    # full blocks, with a partial last k-block, an odd k-block count and a single k-block
    "short_tails": (7, [64, 65, 192, 129, 1, 63, 320], 200, 264),
    "odd_k_blocks": (4, [40, 200, 0, 7], 192, 256),
    "one_k_block": (3, [5, 64, 130], 64, 256),
    "split_k_mixed": (96, [(37 * i) % 200 + 1 for i in range(96)], 768, 1024),
}


def _poisoned_like(t):
    return torch.full_like(t, float("nan"))


@pytest.mark.parametrize("name", list(CASES))
def test_plain_matches_torch(name):
    experts, rows, k, n = CASES[name]
    a, w, offsets, _, total = make(experts, rows, k, n, expert_pad=8)
    out = _poisoned_like(torch.empty(a.shape[0], n, device="cuda", dtype=torch.bfloat16))
    ops.grouped_gemm(a, w, offsets, out)
    ref = torch_fc(a, w, offsets, total)
    assert not out[:total].isnan().any()
    assert out[total:].isnan().all(), "rows outside the experts' ranges were written"
    err_torch, err_64 = rel_l2(out[:total], ref), rel_l2(out[:total], oracle(a, w, offsets, total))
    print(name, f"vs torch {err_torch:.2e} vs float64 {err_64:.2e}")
    assert err_torch < VS_TORCH and err_64 < VS_FLOAT64


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "gelu", "squared_relu"])
@pytest.mark.parametrize("name", ["aligned", "ragged", "many_tiles", "short_tails"])
def test_activation_epilogue_matches_v1(name, activation):
    experts, rows, k, n = CASES[name]
    gated = get_activation(activation).gated
    n_w = 2 * n if gated else n
    a, w, offsets, prob, total = make(experts, rows, k, n_w, seed=1)
    out = _poisoned_like(torch.empty(a.shape[0], n, device="cuda", dtype=torch.bfloat16))
    h_out = _poisoned_like(torch.empty(a.shape[0], n_w, device="cuda", dtype=torch.bfloat16))
    ops.grouped_gemm(a, w, offsets, out, activation=activation, row_prob=prob, h_out=h_out)

    h_ref = torch_fc(a, w, offsets, total)
    act_ref = torch.empty(total, n, device="cuda", dtype=torch.bfloat16)
    num_rows = offsets[-1:].clone()
    ops.activation_forward(h_ref, prob, num_rows, activation, act_ref)

    assert out[total:].isnan().all() and h_out[total:].isnan().all()
    errs = {"h": rel_l2(h_out[:total], h_ref), "act": rel_l2(out[:total], act_ref),
            "act_f64": rel_l2(out[:total],
                              oracle(a, w, offsets, total, prob=prob, activation=activation))}
    print(name, activation, {k: f"{v:.2e}" for k, v in errs.items()})
    assert errs["h"] < VS_TORCH and errs["act"] < VS_TORCH and errs["act_f64"] < VS_FLOAT64


def test_bitwise_deterministic_and_no_h_out_same_result():
    a, w, offsets, prob, total = make(8, [500, 0, 129, 64, 1, 700, 33, 256], 1024, 2 * 384,
                                      seed=2)
    results = []
    for with_h in (True, True, False):
        out = _poisoned_like(torch.empty(a.shape[0], 384, device="cuda", dtype=torch.bfloat16))
        h = torch.empty(a.shape[0], 768, device="cuda", dtype=torch.bfloat16) if with_h else None
        ops.grouped_gemm(a, w, offsets, out, activation="swiglu", row_prob=prob, h_out=h)
        results.append(out[:total].clone())
    assert all(torch.equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize("name", ["ragged", "many_tiles", "short_tails", "split_k_mixed"])
def test_tile_order_changes_no_bits(name):
    """m_group (the tile order's m-blocks per group: the default, each m-block alone, groups
    that end mid-expert, one group per expert) moves only when tiles run: the same bits, plain
    and with the activation epilogue, every row written."""
    experts, rows, k, n = CASES[name]
    a, w, offsets, prob, total = make(experts, rows, k, 2 * n, seed=4)
    results = []
    for m_group in (0, 1, 3, 65536):
        out = _poisoned_like(torch.empty(a.shape[0], n, device="cuda", dtype=torch.bfloat16))
        h = _poisoned_like(torch.empty(a.shape[0], 2 * n, device="cuda", dtype=torch.bfloat16))
        plain = _poisoned_like(h)
        ops.grouped_gemm(a, w, offsets, out, activation="swiglu", row_prob=prob, h_out=h,
                         m_group=m_group)
        ops.grouped_gemm(a, w, offsets, plain, m_group=m_group)
        assert not h[:total].isnan().any() and not out[:total].isnan().any()
        results.append((out[:total], h[:total], plain[:total]))
    assert rel_l2(results[0][2], torch_fc(a, w, offsets, total)) < VS_TORCH
    for got in results[1:]:
        assert all(torch.equal(x, y) for x, y in zip(results[0], got))
    assert torch.equal(results[0][1], results[0][2]), "plain FC1's h is the epilogue's h"


def test_zero_rows_writes_nothing():
    a, w, offsets, _, _ = make(4, [0, 0, 0, 0], 128, 256, cap_extra=64)
    out = _poisoned_like(torch.empty(a.shape[0], 256, device="cuda", dtype=torch.bfloat16))
    ops.grouped_gemm(a, w, offsets, out)
    torch.cuda.synchronize()
    assert out.isnan().all()
    assert ops.timeout_reports() == []


def test_bad_inputs_raise():
    a, w, offsets, prob, _ = make(2, [4, 4], 128, 256)
    out = torch.empty(a.shape[0], 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="activation"):
        ops.grouped_gemm(a, w, offsets, out, activation="tanh", row_prob=prob)
    with pytest.raises(ValueError, match="row_prob"):
        ops.grouped_gemm(a, w, offsets, out, activation="gelu")
    with pytest.raises(RuntimeError, match="K"):
        ops.grouped_gemm(a[:, :64], w, offsets, out)
    with pytest.raises(RuntimeError, match="offsets"):
        ops.grouped_gemm(a, w, offsets[:2], out)
    with pytest.raises(RuntimeError, match="positive"):
        ops.grouped_gemm(a, w[:1].expand(2, -1, -1), offsets, out)
    with pytest.raises(RuntimeError, match="m_group must be"):
        ops.grouped_gemm(a, w, offsets, out, m_group=-1)


# Weight gradients added into fp32 gradients (ops.grouped_wgrad_accumulate): expert row counts
# off every k-block edge (64 rows), empty experts, one row; M and N off the tile edges.
WGRAD_CASES = {
    # name: (rows per expert, M, N)
    "ragged": ([0, 1, 63, 64, 65, 300, 0, 517], 200, 328),
    "aligned": ([256, 512, 128], 256, 512),
    "one_expert_tall": ([4096], 136, 264),
}


def _wgrad_problem(counts, m_dim, n_dim, seed=3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    offsets = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32,
                           device="cuda")
    total, extra = sum(counts), 45
    # Rows past the experts' end hold NaN: a kernel that read them would show it.
    a = torch.full((total + extra, m_dim), float("nan"), device="cuda").bfloat16()
    b = torch.full((total + extra, n_dim), float("nan"), device="cuda").bfloat16()
    a[:total] = torch.randn(total, m_dim, device="cuda", generator=g).bfloat16()
    b[:total] = torch.randn(total, n_dim, device="cuda", generator=g).bfloat16()
    start = torch.randn(len(counts), m_dim, n_dim, device="cuda", generator=g)
    return a, b, offsets, start


@pytest.mark.parametrize("name", WGRAD_CASES)
def test_grouped_wgrad_accumulates_fp32_in_place(name):
    """grad[e] += A[rows of e]^T B[rows of e] in fp32, each element once: against a float64
    oracle within fp32 accumulation error, per-expert gradients (views of one buffer and
    separate tensors alike, through the address table), empty experts' bits untouched, the
    same bits on a second run from the same start."""
    counts, m_dim, n_dim = WGRAD_CASES[name]
    a, b, offsets, start = _wgrad_problem(counts, m_dim, n_dim)
    results = []
    for _ in range(2):
        grads = [start[e].clone() for e in range(len(counts))]
        table = torch.tensor([t.data_ptr() for t in grads], dtype=torch.int64, device="cuda")
        ops.grouped_wgrad_accumulate(a, b, offsets, table)
        results.append(torch.stack(grads))
    assert torch.equal(results[0], results[1]), "the gradients differ between runs"
    for e, n in enumerate(counts):
        lo = int(offsets[e])
        if n == 0:
            assert torch.equal(results[0][e], start[e]), f"expert {e} without rows changed"
            continue
        want = start[e].double() + a[lo:lo + n].double().t() @ b[lo:lo + n].double()
        err = rel_l2(results[0][e] - start[e], want - start[e].double())
        assert err < 1e-5, (e, err)


def test_grouped_wgrad_bad_inputs_raise():
    a, b, offsets, start = _wgrad_problem([3, 5], 64, 64)
    table = torch.tensor([start[0].data_ptr(), start[1].data_ptr()], dtype=torch.int64,
                         device="cuda")
    with pytest.raises(ValueError, match="must be torch.bfloat16"):
        ops.grouped_wgrad_accumulate(a.float(), b, offsets, table)
    with pytest.raises(RuntimeError, match="address per expert"):
        ops.grouped_wgrad_accumulate(a, b, offsets, table[:1])
    with pytest.raises(RuntimeError, match="same rows"):
        ops.grouped_wgrad_accumulate(a[:-1], b, offsets, table)
