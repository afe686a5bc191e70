"""Benchmark the sm90 grouped GEMM tile engine against torch._grouped_mm on one GPU (EP=1, no
communication), on the per-GPU expert work of the model shapes.

For each model, variant and token count: rows = tokens x topk routed uniformly at random over
the local experts (``full``: E / --ep experts per GPU, ``ep64``: the EP64-equivalent count).
FC1: ours with SwiGLU x prob fused (also writing h, as training needs) vs torch._grouped_mm
followed by v1's activation kernel. FC2: ours (plain) vs torch._grouped_mm. Every timed pair is
also compared for results (rel-L2; the run stops above the tests' tolerance). With --mxfp8,
also the engine on MXFP8 weights (codes dequantized in shared memory, mxfp8_weights.py; the
same operands' result bit for bit as on the rounded bf16 weights, which is checked), the
recipe's dgrads on it (the weights in their transposed orientation, against torch._grouped_mm
on the rounded operands and next to the BF16 recipe's torch dgrads), the 1 x 32 rounding of an
activation operand and the once-per-step weight quantization. With --fp8-blockwise, the
blockwise FP8 engine (run_fp8_blockwise) next to torch._scaled_mm and cuBLAS's blockwise GEMM,
with its ring depths and tile orders (RING_VARIANTS). With --fp8-baselines, only the blockwise
FP8 grouped GEMMs of the layer (FC1, FC2 and both dgrads, ragged expert sizes) next to the
public Hopper kernels on the same operands: CUTLASS's grouped blockwise GEMM, DeepGEMM's
m-grouped contiguous GEMM and cuBLAS's blockwise GEMM on the dense equivalent
(run_fp8_baselines; benchmarks/probes/cutlass_fp8_grouped/README.md), ours with 128- and
192-column tiles (`ours_n192`, checked bit for bit against the 128 tiles). JSON to --out.

    python scripts/bench_gemm.py --out benchmarks/results/<card>-<date>-<what>/gemm_engine.json
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
from datetime import date
from pathlib import Path

import torch

import fp8_grouped_baselines as baselines
from gpu_timing import mean_seconds, median_ms
from mok_megatron.cuda import ops
from mok_megatron.config import load_model
from mok_megatron.recipes.fp8_blockwise import engine_row_values, engine_weight_values
from mok_megatron.cuda.mxfp8_weights import quantize_pair, quantize_weight, quantize_weight_transposed


def per_gpu_experts(model, variant: str, ep: int) -> int:
    """Local experts of one GPU: `full` = E / ep, `ep64` = the EP64-equivalent count."""
    return model.num_experts // ep if variant == "full" else model.bench.ep64_experts_per_gpu


# The engine's tolerance against torch._grouped_mm in tests/gpu/test_grouped_gemm.py.
MAX_REL_L2 = 3e-3


def rel_l2(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check_agreement(errors: dict, what: str) -> None:
    """Stops the run where a compared pair is beyond the tests' tolerance (or NaN)."""
    bad = {k: v for k, v in errors.items() if not v <= MAX_REL_L2}
    if bad:
        raise RuntimeError(f"{what} disagree (rel-L2 > {MAX_REL_L2}): {bad}")


def grouped_problem(model, local: int, tokens: int, seed: int):
    """One GPU's expert work: rows = tokens x topk routed uniformly at random over `local`
    experts (grouped by expert), and counts, offsets [E + 1] (int32), x, w1, w2, prob."""
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = tokens * K
    expert = torch.randint(0, local, (rows,), device="cuda", generator=g)
    counts = torch.bincount(expert, minlength=local)
    offsets = torch.zeros(local + 1, dtype=torch.int32, device="cuda")
    offsets[1:] = counts.cumsum(0)
    x = torch.randn(rows, H, device="cuda", generator=g).bfloat16()
    w1 = (torch.randn(local, 2 * F, H, device="cuda", generator=g) * H**-0.5).bfloat16()
    w2 = (torch.randn(local, H, F, device="cuda", generator=g) * F**-0.5).bfloat16()
    prob = torch.rand(rows, device="cuda", generator=g)
    return counts, offsets, x, w1, w2, prob


def run_case(model, local: int, tokens: int, iters: int, warmup: int, seed: int,
             mxfp8: bool = False) -> dict:
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    rows = tokens * K
    counts, offsets, x, w1, w2, prob = grouped_problem(model, local, tokens, seed)
    num_rows = offsets[-1:].clone()

    act_ours = torch.empty(rows, F, device="cuda", dtype=torch.bfloat16)
    h_ours = torch.empty(rows, 2 * F, device="cuda", dtype=torch.bfloat16)
    act_torch = torch.empty_like(act_ours)
    y_ours = torch.empty(rows, H, device="cuda", dtype=torch.bfloat16)

    def fc1_ours():
        ops.grouped_gemm(x, w1, offsets, act_ours, activation="swiglu", row_prob=prob,
                         h_out=h_ours)

    def fc1_torch():
        h = torch._grouped_mm(x, w1.transpose(1, 2), offs=offsets[1:])
        ops.activation_forward(h, prob, num_rows, "swiglu", act_torch)
        return h

    def fc2_ours():
        ops.grouped_gemm(act_torch, w2, offsets, y_ours)

    def fc2_torch():
        return torch._grouped_mm(act_torch, w2.transpose(1, 2), offs=offsets[1:])

    # FC1 as backward recomputes it after the forward megakernel (h alone, plain epilogue),
    # in the engine's tile order and in the plain one (m_group=1), next to torch's.
    h_plain = {m: torch.full_like(h_ours, float("nan")) for m in (0, 1)}

    def fc1_plain_ours(m_group: int):
        ops.grouped_gemm(x, w1, offsets, h_plain[m_group], m_group=m_group)

    fc1_ours()
    h_torch = fc1_torch()
    fc2_ours()
    y_torch = fc2_torch()
    for m_group in h_plain:
        fc1_plain_ours(m_group)
    if not all(torch.equal(h[:rows], h_ours[:rows]) for h in h_plain.values()):
        raise RuntimeError("the plain FC1's h differs from the activation epilogue's")
    errors = {"h": rel_l2(h_ours, h_torch), "act": rel_l2(act_ours, act_torch),
              "fc2": rel_l2(y_ours, y_torch)}
    check_agreement(errors, "engine and torch")
    timed = [("fc1_ours", fc1_ours), ("fc1_torch", fc1_torch), ("fc2_ours", fc2_ours),
             ("fc2_torch", fc2_torch), ("fc1_plain_ours", lambda: fc1_plain_ours(0)),
             ("fc1_plain_ours_m1", lambda: fc1_plain_ours(1)),
             ("fc1_plain_torch", lambda: torch._grouped_mm(x, w1.transpose(1, 2),
                                                           offs=offsets[1:]))]
    if mxfp8:
        q1, q2 = quantize_weight(w1, halves=2), quantize_weight(w2)
        act_mx, h_mx, y_mx = (torch.empty_like(t) for t in (act_ours, h_ours, y_ours))

        def fc1_mx():
            ops.grouped_gemm(x, q1.codes, offsets, act_mx, activation="swiglu", row_prob=prob,
                             h_out=h_mx, w_scales=q1.scales)

        def fc2_mx():
            ops.grouped_gemm(act_torch, q2.codes, offsets, y_mx, w_scales=q2.scales)

        def quantize():
            quantize_pair(w1, w2, gated=True)

        fc1_mx()
        fc2_mx()
        w1r = ops.mx_round_columns(w1.view(-1, H)).view_as(w1)
        w2r = ops.mx_round_columns(w2.view(-1, F)).view_as(w2)
        ops.grouped_gemm(x, w1r, offsets, act_ours, activation="swiglu", row_prob=prob,
                         h_out=h_ours)
        ops.grouped_gemm(act_torch, w2r, offsets, y_ours)
        for a, b in ((act_mx, act_ours), (h_mx, h_ours), (y_mx, y_ours)):
            if not torch.equal(a[:rows], b[:rows]):
                raise RuntimeError("MXFP8 weights: not the engine's result on the rounded weights")
        del w1r, w2r
        # The dgrads (the layer's dact = dY W2 and dx = dh W1, the weights in their transposed
        # orientation) on operands rounded beforehand, against torch on the rounded values,
        # next to the BF16 recipe's torch._grouped_mm dgrads.
        q1t, q2t = quantize_weight_transposed(w1), quantize_weight_transposed(w2)
        offs = offsets[1:]
        dout = torch.randn(rows, H, device="cuda").bfloat16()
        dh = torch.randn(rows, 2 * F, device="cuda").bfloat16()
        dgrads = {}
        for name, a, w, q in (("dgrad2", dout, w2, q2t), ("dgrad1", dh, w1, q1t)):
            E_, r_, c_ = w.shape
            a_r = ops.mx_round_columns(a)
            w_r = ops.mx_round_columns(w.transpose(1, 2).reshape(E_ * c_, r_)).view(E_, c_, r_)
            out_mx = torch.empty(rows, c_, device="cuda", dtype=torch.bfloat16)
            dgrads[f"{name}_mx"] = (lambda a_r=a_r, q=q, o=out_mx: ops.grouped_gemm(
                a_r, q.codes, offsets, o, w_scales=q.scales))
            dgrads[f"{name}_torch"] = (lambda a=a, w=w: torch._grouped_mm(a, w, offs=offs))
            dgrads[f"{name}_mx"]()
            errors[f"mx_{name}"] = rel_l2(out_mx[:rows], torch._grouped_mm(
                a_r, w_r.transpose(1, 2), offs=offs))
            del w_r
        check_agreement(errors, "MXFP8 dgrads and torch on the rounded operands")
        timed += [("fc1_mx", fc1_mx), ("fc2_mx", fc2_mx), *dgrads.items(),
                  ("round_x_mx", lambda: ops.mx_round_columns(x)),
                  ("quantize_weights", quantize)]
    t = {name: median_ms(fn, iters, warmup) for name, fn in timed}
    flops1, flops2 = 2 * rows * H * 2 * F, 2 * rows * F * H
    bytes1 = w1.numel() * 2 + x.numel() * 2 + rows * 3 * F * 2
    bytes2 = w2.numel() * 2 + rows * F * 2 + rows * H * 2
    return {
        "local_experts": local, "tokens": tokens, "rows": rows,
        "rows_per_expert_max": int(counts.max()), "errors": errors, "ms": t,
        "tflops": {"fc1_ours": flops1 / t["fc1_ours"] / 1e9,
                   "fc1_torch": flops1 / t["fc1_torch"] / 1e9,
                   "fc2_ours": flops2 / t["fc2_ours"] / 1e9,
                   "fc2_torch": flops2 / t["fc2_torch"] / 1e9},
        "hbm_bytes": {"fc1": bytes1, "fc2": bytes2},
        "speedup": {"fc1": t["fc1_torch"] / t["fc1_ours"], "fc2": t["fc2_torch"] / t["fc2_ours"],
                    "fc1_plain": t["fc1_plain_torch"] / t["fc1_plain_ours"],
                    "fc1_plain_m1": t["fc1_plain_torch"] / t["fc1_plain_ours_m1"],
                    **({"fc1_mx_vs_torch": t["fc1_torch"] / t["fc1_mx"],
                        "fc2_mx_vs_torch": t["fc2_torch"] / t["fc2_mx"]} if mxfp8 else {})},
    }


# (stages, m_group, cluster_ctas) of the FP8 engine timed beside its defaults
# (ops.fp8_grouped_gemm; 0: the default): the ring's depth in the plain tile order, m-block
# groups at the default depth, then CTA pairs sharing weight tiles.
RING_VARIANTS = [(5, 1, 1), (6, 1, 1), (0, 1, 1), (0, 16, 1), (0, 0, 2), (5, 0, 2), (0, 16, 2)]


def run_fp8_blockwise(model, local: int, tokens: int, iters: int, warmup: int,
                      seed: int) -> dict:
    """The blockwise FP8 engine on one GPU's expert work: FC1 (SwiGLU x prob, h written) and
    FC2 on E4M3 codes with 1 x 128 / 128 x 128 power-of-two scales, the per-call row
    quantization, and torch._scaled_mm (cuBLAS FP8, row-wise scales) on one dense GEMM of the
    same rows x N x K for the tensor cores' FP8 rate; then the same recipe on that dense GEMM,
    our engine next to cuBLAS's blockwise GEMM (dense_blockwise). Checked against the BF16
    engine on the dequantized operands (exact in bf16: only the summation order differs)."""
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    rows = tokens * K
    counts, offsets, x, w1, w2, prob = grouped_problem(model, local, tokens, seed)
    act = torch.empty(rows, F, device="cuda", dtype=torch.bfloat16)
    h = torch.empty(rows, 2 * F, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(rows, H, device="cuda", dtype=torch.bfloat16)
    x_q = ops.fp8_quantize_rows(x)
    w1_q, w2_q = ops.fp8_quantize_weight_blocks(w1), ops.fp8_quantize_weight_blocks(w2)

    def fc1_fp8(stages=0, m_group=0, ctas=1, block_n=0, keep_h=True):
        ops.fp8_grouped_gemm(*x_q, *w1_q, offsets, act, activation="swiglu", row_prob=prob,
                             h_out=h if keep_h else None, stages=stages, m_group=m_group,
                             cluster_ctas=ctas, block_n=block_n)

    fc1_fp8()
    act_q = ops.fp8_quantize_rows(act)

    def fc2_fp8(stages=0, m_group=0, ctas=1, block_n=0):
        ops.fp8_grouped_gemm(*act_q, *w2_q, offsets, y, stages=stages, m_group=m_group,
                             cluster_ctas=ctas, block_n=block_n)

    fc2_fp8()
    # The ring's depth and the tile order's groups (RING_VARIANTS): the same bits as the
    # defaults; a depth that does not fit beside this launch's expert tables is left out.
    act_default, y_default, h_default = act.clone(), y.clone(), h.clone()
    wide = ops.FP8_WIDE_BLOCK_N
    # The 192-column tiles (FC1's: 96 gate + 96 up weight rows), alone and as CTA pairs: the
    # 128-column tiles' act, h and y.
    for ctas in (1, 2):
        fc1_fp8(ctas=ctas, block_n=wide)
        fc2_fp8(ctas=ctas, block_n=wide)
        if not (torch.equal(act, act_default) and torch.equal(h, h_default)
                and torch.equal(y, y_default)):
            raise SystemExit(f"the 192-column tiles (cluster_ctas={ctas}) give other bits "
                             "than the 128-column tiles")
    variants, ring_same_bits = [], True
    for v in RING_VARIANTS:
        try:
            fc1_fp8(*v)
        except RuntimeError as e:
            if "do not fit" not in str(e):
                raise
            continue
        fc2_fp8(*v)
        ring_same_bits &= torch.equal(act, act_default) and torch.equal(y, y_default)
        variants.append(v)
    act_ref, y_ref = torch.empty_like(act), torch.empty_like(y)
    bf16 = torch.bfloat16
    ops.grouped_gemm(engine_row_values(*x_q, bf16), engine_weight_values(*w1_q, bf16), offsets,
                     act_ref, activation="swiglu", row_prob=prob)
    ops.grouped_gemm(engine_row_values(*act_q, bf16), engine_weight_values(*w2_q, bf16),
                     offsets, y_ref)
    torch.cuda.empty_cache()
    errors = {"fp8_act": rel_l2(act, act_ref), "fp8_fc2": rel_l2(y, y_ref)}
    check_agreement(errors, "FP8 engine and BF16 engine")

    def dense_fp8(n, k):
        a = torch.randn(rows, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.ones(rows, 1, device="cuda")
        sb = torch.ones(1, n, device="cuda")
        return lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb,
                                        out_dtype=torch.bfloat16)

    timed = [("fc1_fp8", fc1_fp8), ("fc2_fp8", fc2_fp8),
             ("fc1_fp8_n192", lambda: fc1_fp8(block_n=wide)),
             ("fc2_fp8_n192", lambda: fc2_fp8(block_n=wide)),
             ("fc1_fp8_n192_c2", lambda: fc1_fp8(ctas=2, block_n=wide)),
             ("fc2_fp8_n192_c2", lambda: fc2_fp8(ctas=2, block_n=wide)),
             # What the separate path runs recomputing: forward's FC1 without h, backward's
             # h as the plain product.
             ("fc1_fp8_act_n192", lambda: fc1_fp8(block_n=wide, keep_h=False)),
             ("fc1_fp8_act_n192_c2", lambda: fc1_fp8(ctas=2, block_n=wide, keep_h=False)),
             ("fc1_fp8_h_n192", lambda: ops.fp8_grouped_gemm(*x_q, *w1_q, offsets, h,
                                                             block_n=wide))]
    for v in variants:
        name = "s{}_g{}_c{}".format(*v)
        timed += [(f"fc1_fp8_{name}", lambda v=v: fc1_fp8(*v)),
                  (f"fc2_fp8_{name}", lambda v=v: fc2_fp8(*v))]
    timed += [
             ("quantize_x", lambda: ops.fp8_quantize_rows(x)),
             ("quantize_act", lambda: ops.fp8_quantize_rows(act)),
             ("scaled_mm_fc1", dense_fp8(2 * F, H)), ("scaled_mm_fc2", dense_fp8(H, F)),
             ("quantize_weights", lambda: (ops.fp8_quantize_weight_blocks(w1),
                                           ops.fp8_quantize_weight_blocks(w2)))]
    # The same recipe on the same dense problem: our engine (one expert of every row) next to
    # cuBLAS's DeepSeek-style blockwise GEMM where this torch has it (torch.nn.functional
    # scaled_mm, 1 x 128 x 128 x 128 scales), checked against each other.
    blockwise = {}
    for name, n, k in (("fc1", 2 * F, H), ("fc2", H, F)):
        engine, cublas, agree = dense_blockwise(rows, n, k)
        timed.append((f"engine_dense_{name}", engine))
        if isinstance(cublas, str):
            blockwise[name] = cublas
        else:
            timed.append((f"blockwise_mm_{name}", cublas))
            errors[f"engine_vs_blockwise_mm_{name}"] = agree
    t = {name: median_ms(fn, iters, warmup) for name, fn in timed}
    flops = {"fc1": 2 * rows * H * 2 * F, "fc2": 2 * rows * F * H}
    # Every timing of FC1 or FC2 (its name says which), as TFLOP/s.
    tflops = {name: flops[gemm] / ms / 1e9 for name, ms in t.items() for gemm in flops
              if gemm in name}
    return {"errors": errors, "ms": t, "tflops": tflops, "blockwise_mm_unavailable": blockwise,
            "ring_variants_same_bits": ring_same_bits}


def dense_blockwise(rows: int, n: int, k: int, **engine_options):
    """-> (our FP8 engine on a dense rows x n x k problem with 1 x 128 / 128 x 128 scales,
    cuBLAS's blockwise GEMM on the same codes and scales or why it cannot run here, their
    outputs' rel-L2). The scales are random powers of two, the same values for both.
    ``engine_options``: ops.fp8_grouped_gemm's (stages, m_group, cluster_ctas)."""
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(rows, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(1, n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
    kb = -(-k // 128)
    a_exp = torch.randint(-3, 4, (rows, kb), device="cuda", generator=g)
    w_exp = torch.randint(-3, 4, (1, -(-n // 128), kb), device="cuda", generator=g)
    a_scales = torch.zeros(kb, -(-rows // 16) * 16, dtype=torch.uint8, device="cuda")
    a_scales[:, :rows] = (a_exp + 127).t().to(torch.uint8)
    w_scales = (w_exp + 127).to(torch.uint8)
    offsets = torch.tensor([0, rows], dtype=torch.int32, device="cuda")
    out = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")

    def engine():
        ops.fp8_grouped_gemm(a, a_scales, w, w_scales, offsets, out, **engine_options)

    try:
        from torch.nn.functional import ScalingType, SwizzleType, scaled_mm
    except ImportError as e:
        return engine, f"torch {torch.__version__}: {e}", None
    # cuBLAS's layouts: A's scales [rows, K / 128] outer-dim major, B's [K / 128 padded to 4,
    # N / 128] with K blocks innermost (torch's test_scaled_mm_block_wise_numerics).
    sa = torch.exp2(a_exp.float()).t().contiguous().t()
    l4 = -(-kb // 4) * 4
    sb = torch.zeros(w_exp.shape[1], l4, device="cuda")
    sb[:, :kb] = torch.exp2(w_exp[0].float())
    sb = sb.t()

    def cublas():
        return scaled_mm(a, w[0].t(), sa, ScalingType.BlockWise1x128, sb,
                         ScalingType.BlockWise128x128, swizzle_a=SwizzleType.NO_SWIZZLE,
                         swizzle_b=SwizzleType.NO_SWIZZLE, output_dtype=torch.bfloat16)

    try:
        got = cublas()
    except (RuntimeError, NotImplementedError, ValueError) as e:
        return engine, f"{type(e).__name__}: {str(e)[:200]}", None
    engine()
    return engine, cublas, rel_l2(out, got)


def ragged_counts(rows: int, experts: int, seed: int) -> torch.Tensor:
    """Rows per expert (int64, summing to `rows`) with the cases a grouped GEMM must handle:
    expert 0 gets none, expert 1 fewer than 128 (100), the others a Zipf-like share (weight
    1 / (i + 1)^0.7, shuffled by `seed`), so most sizes are no multiple of 128."""
    counts = torch.zeros(experts, dtype=torch.int64)
    if experts < 3:
        counts[-1] = rows
        return counts
    counts[1] = min(rows, 100)
    rest = rows - int(counts[1])
    g = torch.Generator().manual_seed(seed)
    weights = (torch.arange(experts - 2, dtype=torch.float64) + 1) ** -0.7
    weights = weights[torch.randperm(experts - 2, generator=g)]
    share = torch.floor(rest * weights / weights.sum()).to(torch.int64)
    share[-1] += rest - int(share.sum())
    counts[2:] = share
    return counts


# What the baselines get done before timing, as the results record it.
BASELINES_UNTIMED = ("outside the timed region: E8M0 scale codes -> fp32 scales in each kernel's "
                     "layout; CUTLASS's per-group tables (device fill) and kernel parameters; "
                     "DeepGEMM's rows copied into its layout, each expert padded to 128 rows")


# The GEMMs of one expert layer, timed against the public kernels: (operand width K, output
# width N, whose weight) per name; the dgrads read the weights' transposed orientation.
LAYER_GEMMS = {"fc1": ("H", "2F", "w1"), "fc2": ("F", "H", "w2"),
               "dgrad_fc2": ("H", "F", "w2t"), "dgrad_fc1": ("2F", "H", "w1t")}


def run_fp8_baselines(model, local: int, tokens: int, iters: int, warmup: int,
                      seed: int) -> dict:
    """Our blockwise FP8 grouped GEMM (plain: no epilogue) next to the public Hopper kernels on
    the same operands, for each GEMM of LAYER_GEMMS: rows = tokens x topk over `local`
    experts with ragged sizes (ragged_counts: an empty expert and one under 128 rows).
    - CUTLASS's sm90 grouped GEMM with blockwise scaling (fp8_grouped_baselines): the
      fastest of its compiled variants and raster orders, chosen by a short mean timing;
    - DeepGEMM's m_grouped_fp8_gemm_nt_contiguous, rows padded per expert to 128;
    - cuBLAS's blockwise GEMM through torch on the dense equivalent (all rows one expert),
      with our engine on that dense problem beside it (dense_blockwise).
    Operand conversions (fp32 scales, padding, the kernels' group tables) happen once before
    timing. Every output is first compared (rel-L2, MAX_REL_L2) with the product of the
    dequantized operands (dequantized_product; cuBLAS's dense one with ours on the dense
    problem); a baseline that disagrees or fails is reported and not timed, ours disagreeing
    stops the run."""
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    rows = tokens * K
    width = {"H": H, "F": F, "2F": 2 * F}
    counts = ragged_counts(rows, local, seed)
    offsets = torch.zeros(local + 1, dtype=torch.int32)
    offsets[1:] = counts.cumsum(0)
    offsets = offsets.cuda()
    g = torch.Generator(device="cuda").manual_seed(seed)
    weights = {}
    for name, n, k in (("w1", 2 * F, H), ("w2", H, F)):
        w = (torch.randn(local, n, k, device="cuda", generator=g) * k**-0.5).bfloat16()
        codes, scales, codes_t, scales_t = ops.fp8_quantize_weight_blocks(w, transposed=True)
        weights[name], weights[name + "t"] = (codes, scales), (codes_t, scales_t)
        del w
    cutlass, deep_gemm = baselines.load_cutlass(), baselines.load_deep_gemm()
    skipped = {name: why for name, why in (("cutlass", cutlass), ("deepgemm", deep_gemm))
               if isinstance(why, str)}
    result = {"local_experts": local, "tokens": tokens, "rows": rows,
              "rows_per_expert": counts.tolist(), "skipped": skipped,
              "untimed": BASELINES_UNTIMED, "gemms": {}}
    for gemm, (k_name, n_name, w_name) in LAYER_GEMMS.items():
        k, n = width[k_name], width[n_name]
        w_codes, w_scales = weights[w_name]
        a_codes, a_scales = ops.fp8_quantize_rows(
            torch.randn(rows, k, device="cuda", generator=g).bfloat16())
        ref = dequantized_product(a_codes, a_scales, w_codes, w_scales, counts)
        errors, timed, notes = {}, {}, {}
        out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
        timed["ours"] = functools.partial(ops.fp8_grouped_gemm, a_codes, a_scales, w_codes,
                                          w_scales, offsets, out)
        timed["ours"]()
        errors["ours"] = rel_l2(out, ref)
        check_agreement({"ours": errors["ours"]}, f"{gemm}: the FP8 engine and the reference")
        # The 192-column tiles (plain epilogue): the same bits as the 128 tiles, then timed.
        wide = torch.full_like(out, float("nan"))
        timed["ours_n192"] = functools.partial(ops.fp8_grouped_gemm, a_codes, a_scales,
                                               w_codes, w_scales, offsets, wide,
                                               block_n=ops.FP8_WIDE_BLOCK_N)
        timed["ours_n192"]()
        if not torch.equal(wide.view(torch.int16), out.view(torch.int16)):
            raise SystemExit(f"{gemm}: the 192-column tiles' output differs from the 128 "
                             f"tiles' (rel-L2 {rel_l2(wide, out):.1e})")
        if "cutlass" not in skipped:
            out_c = torch.full_like(out, float("nan"))
            try:
                launch, chosen, tried = baselines.cutlass_launch(
                    cutlass, a_codes, a_scales, w_codes, w_scales, offsets, out_c,
                    lambda fn: mean_seconds(fn, iters=10, warmup=2))
                launch()
                errors["cutlass"] = rel_l2(out_c, ref)
                notes["cutlass_variant"], notes["cutlass_candidates_s"] = chosen, tried
                timed["cutlass"] = launch
            except RuntimeError as e:
                notes["cutlass_failed"] = str(e)[:400]
        if "deepgemm" not in skipped:
            try:
                launch, output = baselines.deepgemm_launch(deep_gemm, a_codes, a_scales,
                                                           w_codes, w_scales, offsets, n)
                launch()
                errors["deepgemm"] = rel_l2(output(), ref)
                timed["deepgemm"] = launch
            except RuntimeError as e:
                notes["deepgemm_failed"] = str(e)[:400]
        engine, cublas, agree = dense_blockwise(rows, n, k)
        timed["ours_dense"] = engine
        if isinstance(cublas, str):
            notes["cublas_dense_unavailable"] = cublas
        else:
            timed["cublas_dense"], errors["cublas_dense"] = cublas, agree
        disagree = {b: e for b, e in errors.items() if not e <= MAX_REL_L2}
        for b in disagree:
            timed.pop(b)
        ms = {b: median_ms(fn, iters, warmup) for b, fn in timed.items()}
        tflops = {b: 2 * rows * n * k / t / 1e9 for b, t in ms.items()}
        grouped = [tflops[b] for b in ("cutlass", "deepgemm") if b in tflops]
        any_public = grouped + [tflops[b] for b in ("cublas_dense",) if b in tflops]
        result["gemms"][gemm] = {
            "n": n, "k": k, "ms": ms, "tflops": tflops, "errors": errors,
            "disagree": disagree, **notes,
            "ours_vs_best_grouped": tflops["ours"] / max(grouped) if grouped else None,
            "ours_vs_best_public": tflops["ours"] / max(any_public) if any_public else None,
            "n192_vs_128": tflops["ours_n192"] / tflops["ours"]}
        del ref, out, a_codes, a_scales, timed
        torch.cuda.empty_cache()
    return result


def dequantized_product(a_codes, a_scales, w_codes, w_scales, counts) -> torch.Tensor:
    """The reference: each expert's rows times its weight's transpose on the dequantized
    values (bf16, exact: an E4M3 value times a power of two is a bf16), one torch matmul per
    expert (empty experts included), fp32 accumulation, bf16 out."""
    a = engine_row_values(a_codes, a_scales, torch.bfloat16)
    out = torch.empty(a.shape[0], w_codes.shape[1], device=a.device, dtype=torch.bfloat16)
    first = 0
    for e, m in enumerate(counts.tolist()):
        w = engine_weight_values(w_codes[e:e + 1], w_scales[e:e + 1], torch.bfloat16)[0]
        torch.matmul(a[first:first + m], w.t(), out=out[first:first + m])
        first += m
    return out


def print_baselines(r: dict) -> None:
    """One line per GEMM: TFLOP/s of each kernel, ours / the best grouped and the best public
    kernel, the errors, and what disagreed, failed or was skipped."""
    for gemm, b in r["gemms"].items():
        tf = b["tflops"]
        line = " ".join(f"{name} {tf[name]:5.0f}" for name in
                        ("ours", "ours_n192", "cutlass", "deepgemm", "cublas_dense",
                         "ours_dense") if name in tf)
        for key, label in (("ours_vs_best_grouped", "grouped"), ("ours_vs_best_public", "any")):
            if b[key] is not None:
                line += f" | ours/best {label} x{b[key]:.2f}"
        line += " | rel-L2 " + " ".join(f"{k} {v:.1e}" for k, v in b["errors"].items())
        if b["disagree"]:
            line += f" | DISAGREE, not timed: {sorted(b['disagree'])}"
        if "cutlass_variant" in b:
            line += f" | cutlass {b['cutlass_variant']}"
        for name in ("cutlass", "deepgemm"):
            if f"{name}_failed" in b:
                line += f" | {name} FAILED: {b[f'{name}_failed']}"
        print(f"{'':31s} {gemm:9s} N={b['n']:5d} K={b['k']:5d} TF/s: {line}", flush=True)
    for name, why in r["skipped"].items():
        print(f"{'':31s} {name} skipped: {why}", flush=True)
    print(f"{'':31s} {r['untimed']}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+",
                   default=["qwen3_30b_a3b_like", "deepseek_v3_like", "mok_bench"])
    p.add_argument("--variants", nargs="+", default=["full", "ep64"], choices=["full", "ep64"])
    p.add_argument("--ep", type=int, default=4, help="EP size whose per-GPU work `full` is")
    p.add_argument("--tokens", nargs="+", type=int, default=[2048, 8192])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mxfp8", action="store_true", help="also the engine on MXFP8 weights")
    p.add_argument("--fp8-blockwise", action="store_true",
                   help="also the blockwise FP8 engine and torch._scaled_mm")
    p.add_argument("--fp8-baselines", action="store_true",
                   help="only the blockwise FP8 grouped GEMMs next to CUTLASS, DeepGEMM and "
                        "cuBLAS (run_fp8_baselines)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    results = []
    for name in args.models:
        model = load_model(name)
        for variant in args.variants:
            local = per_gpu_experts(model, variant, args.ep)
            for tokens in args.tokens:
                if args.fp8_baselines:
                    r = run_fp8_baselines(model, local, tokens, args.iters, args.warmup,
                                          args.seed)
                    r.update(model=name, variant=variant)
                    results.append(r)
                    print(f"{name:20s} {variant:4s} E={local:3d} T={tokens:5d} | blockwise FP8 "
                          f"grouped GEMMs, rows per expert {r['rows_per_expert'][:6]}...",
                          flush=True)
                    print_baselines(r)
                    write_results(args.out, results)
                    continue
                r = run_case(model, local, tokens, args.iters, args.warmup, args.seed,
                             args.mxfp8)
                r.update(model=name, variant=variant)
                results.append(r)
                print(f"{name:20s} {variant:4s} E={local:3d} T={tokens:5d} | "
                      f"FC1 ours {r['ms']['fc1_ours']:7.3f} ms ({r['tflops']['fc1_ours']:5.0f} TF)"
                      f" torch {r['ms']['fc1_torch']:7.3f} x{r['speedup']['fc1']:.2f} | "
                      f"FC2 ours {r['ms']['fc2_ours']:7.3f} ms ({r['tflops']['fc2_ours']:5.0f} TF)"
                      f" torch {r['ms']['fc2_torch']:7.3f} x{r['speedup']['fc2']:.2f} | "
                      f"err h {r['errors']['h']:.1e} act {r['errors']['act']:.1e} "
                      f"fc2 {r['errors']['fc2']:.1e}", flush=True)
                m = r["ms"]
                print(f"{'':31s} FC1 plain (h only) ours {m['fc1_plain_ours']:7.3f} ms, in the "
                      f"plain tile order {m['fc1_plain_ours_m1']:7.3f}, torch "
                      f"{m['fc1_plain_torch']:7.3f} x{r['speedup']['fc1_plain']:.2f}", flush=True)
                if args.mxfp8:
                    print(f"{'':31s} MXFP8 weights: FC1 {m['fc1_mx']:7.3f} ms "
                          f"(x{r['speedup']['fc1_mx_vs_torch']:.2f} vs torch bf16) FC2 "
                          f"{m['fc2_mx']:7.3f} ms (x{r['speedup']['fc2_mx_vs_torch']:.2f}); "
                          f"weights quantized {m['quantize_weights']:.2f} ms", flush=True)
                    print(f"{'':31s} MXFP8 dgrads / torch bf16: dY W2 "
                          f"{m['dgrad2_mx']:7.3f} / {m['dgrad2_torch']:7.3f} ms, dh W1 "
                          f"{m['dgrad1_mx']:7.3f} / {m['dgrad1_torch']:7.3f} ms | round x "
                          f"{m['round_x_mx']:.3f} ms | err {r['errors']['mx_dgrad2']:.1e} "
                          f"{r['errors']['mx_dgrad1']:.1e}", flush=True)
                if args.fp8_blockwise:
                    r["fp8_blockwise"] = b = run_fp8_blockwise(model, local, tokens, args.iters,
                                                               args.warmup, args.seed)
                    m, tf = b["ms"], b["tflops"]
                    print(f"{'':31s} FP8 blockwise, 192-column tiles: FC1 "
                          f"{tf['fc1_fp8_n192']:5.0f} TF (x{m['fc1_fp8'] / m['fc1_fp8_n192']:.2f}"
                          f" the 128) FC2 {tf['fc2_fp8_n192']:5.0f} TF "
                          f"(x{m['fc2_fp8'] / m['fc2_fp8_n192']:.2f}); as CTA pairs FC1 "
                          f"{tf['fc1_fp8_n192_c2']:5.0f} FC2 {tf['fc2_fp8_n192_c2']:5.0f} TF; "
                          f"FC1 act alone {tf['fc1_fp8_act_n192']:5.0f} (pairs "
                          f"{tf['fc1_fp8_act_n192_c2']:5.0f}), h alone (plain) "
                          f"{tf['fc1_fp8_h_n192']:5.0f} TF", flush=True)
                    print(f"{'':31s} FP8 blockwise: FC1 {m['fc1_fp8']:7.3f} ms "
                          f"({tf['fc1_fp8']:5.0f} TF, x{r['ms']['fc1_ours'] / m['fc1_fp8']:.2f} "
                          f"vs our bf16) FC2 {m['fc2_fp8']:7.3f} ms ({tf['fc2_fp8']:5.0f} TF, "
                          f"x{r['ms']['fc2_ours'] / m['fc2_fp8']:.2f}) | quantize x "
                          f"{m['quantize_x']:.3f} act {m['quantize_act']:.3f} ms | "
                          f"_scaled_mm dense {tf['scaled_mm_fc1']:5.0f} / "
                          f"{tf['scaled_mm_fc2']:5.0f} TF | weights {m['quantize_weights']:.2f}"
                          f" ms | err {b['errors']['fp8_act']:.1e} {b['errors']['fp8_fc2']:.1e}",
                          flush=True)
                    same = " / ".join(
                        f"{tf[f'engine_dense_{g}']:5.0f} TF ours, " + (
                            f"{tf[f'blockwise_mm_{g}']:5.0f} TF cuBLAS (rel-L2 "
                            f"{b['errors'][f'engine_vs_blockwise_mm_{g}']:.1e})"
                            if f"blockwise_mm_{g}" in tf
                            else f"cuBLAS unavailable: {b['blockwise_mm_unavailable'][g]}")
                        for g in ("fc1", "fc2"))
                    print(f"{'':31s} the same blockwise recipe, dense FC1 / FC2: {same}",
                          flush=True)
                    names = ["s{}_g{}_c{}".format(*v) for v in RING_VARIANTS]
                    ring = ", ".join(f"{n} {tf[f'fc1_fp8_{n}']:5.0f}/{tf[f'fc2_fp8_{n}']:.0f}"
                                     for n in names if f"fc1_fp8_{n}" in tf)
                    print(f"{'':31s} ring depth s / m-block groups g / cluster CTAs c (0: "
                          f"default), FC1/FC2 TF: {ring} (same bits: "
                          f"{b['ring_variants_same_bits']})", flush=True)
                torch.cuda.empty_cache()
                write_results(args.out, results)


def write_results(out: Path, results: list) -> None:
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "date": date.today().isoformat(), "command": " ".join(sys.argv),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "host": platform.node(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
