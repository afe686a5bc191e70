"""Blockwise FP8 quantization (DeepSeek-V3's recipe, Transformer Engine's Float8BlockScaling
with power-of-two scales), the reference every blockwise-FP8 kernel is checked against. Plain
PyTorch, CPU or GPU.

Blocks of BLOCK = 128: activations and gradients in 1x128 blocks (128 consecutive elements of a
row, along the reduction dimension of the GEMM that reads them; ``quantize_rows``), weights in
128x128 blocks over their last two dimensions (``quantize_weight``). Each block gets one scale
2^e, stored as an fp32 tensor holding 2^e itself - the dequantization factor, TE's "scale_inv" -
and its elements are stored as FP8 E4M3 values v / 2^e.

Scale choice: MXFP8's rule (``mxfp8.scale_exponent``): e is the smallest exponent with
amax / 2^e <= 448 (E4M3's largest finite value), clamped to [-127, 127]. Power-of-two scales are
TE's default for blockwise scaling (power_2_scale): scaling is then exact, and so is
dequantization - an E4M3 value has 4 significant bits, a bf16 8 with fp32's exponent range, so
every dequantized value of a block with e >= -124 (amax above about 2^-116) is exact in bf16
(below that, bf16's subnormal step 2^-133 drops low bits, as fp32 would not). Elements:
fp32(v) * 2^-e, clamped to +-448 (a cast would turn values past 464 into NaN), rounded to
nearest-even E4M3. Dequantized: E4M3 value * 2^e, exact in fp32.

A 128x128 block's scale does not depend on the orientation its weight is read in: the
transposed weight (what dgrad reads) is the transposed codes with the transposed scales - no
second rounding, and forward and dgrad multiply the same weight values.

Edge cases, as tested:
  - an all-zero block: e = -127 (scale 2^-127), elements 0 (dequantize to +0 / -0 as given);
  - subnormal inputs: their blocks get small exponents down to -127, where elements below
    E4M3's range round to 0;
  - a block with NaN or +-Inf: its scale is NaN and every element of the block dequantizes to
    NaN - a non-finite value poisons its block, never the rest of the tensor;
  - a size that is not a multiple of 128: the last block along it is shorter (its amax over
    the elements that exist); for a weight that makes the edge blocks 128xk, nx128 or nxk;
  - wgrad's operands (``fake_quantize_segments``): 128x1 blocks along the rows of each
    expert's segment, starting at its first row, never reaching into the next expert; the
    last block of a segment may be short.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from . import quantized_mlp
from .mxfp8 import E4M3_MAX, scale_exponent
from .quantized_mlp import QuantizedGemms, accumulation_dtype

BLOCK = 128


def _blocked(x: torch.Tensor, ndim: int) -> torch.Tensor:
    """x with each of its last `ndim` dims zero-padded to whole blocks and split into
    [blocks, BLOCK]: [..., n] -> [..., n/128, 128], [..., n, k] -> [..., n/128, 128, k/128, 128]."""
    sizes = x.shape[x.dim() - ndim:]
    x = F.pad(x, [p for n in reversed(sizes) for p in (0, (-n) % BLOCK)])
    blocks = [s for n in x.shape[x.dim() - ndim:] for s in (n // BLOCK, BLOCK)]
    return x.reshape(*x.shape[:x.dim() - ndim], *blocks)


def _per_element(t: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """Per-block values t [..., blocks...] repeated over each block's elements and cut to
    `sizes` (the last len(sizes) dims)."""
    for i, n in enumerate(sizes):
        dim = t.dim() - len(sizes) + i
        t = t.repeat_interleave(BLOCK, dim).narrow(dim, 0, n)
    return t


def _quantize_last(x: torch.Tensor, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of x with blocks over its last `ndim` dims (1: 1x128, 2: 128x128)."""
    xf = x.to(torch.float32)
    sizes = xf.shape[xf.dim() - ndim:]
    xb = _blocked(xf, ndim)
    within = tuple(range(-1, -2 * ndim, -2))  # each block's element dims
    finite = torch.isfinite(xb).all(dim=within)
    amax = torch.where(torch.isfinite(xb), xb.abs(), torch.zeros_like(xb)).amax(dim=within)
    e = scale_exponent(amax).to(torch.float32)
    scales = torch.where(finite, torch.exp2(e), torch.full_like(e, float("nan")))
    scaled = xf * _per_element(torch.exp2(-e), sizes)
    codes = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scales


def quantize_rows(x: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """1x128 blocks along `dim`: (codes, float8_e4m3fn with x's shape; scales, fp32 2^e of x's
    shape with `dim` replaced by ceil(n / 128))."""
    codes, scales = _quantize_last(x.movedim(dim, -1), 1)
    return codes.movedim(-1, dim), scales.movedim(-1, dim)


def dequantize_rows(codes: torch.Tensor, scales: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """fp32 values of quantize_rows' outputs (the same dim)."""
    n = codes.shape[dim]
    scale = _per_element(scales.movedim(dim, -1), [n]).movedim(-1, dim)
    return codes.to(torch.float32) * scale


def fake_quantize_rows(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x rounded to 1x128-block FP8 along `dim` and back, as fp32 (exact)."""
    return dequantize_rows(*quantize_rows(x, dim), dim=dim)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """128x128 blocks over w's last two dims [..., N, K]: (codes, float8_e4m3fn with w's shape;
    scales, fp32 2^e [..., ceil(N / 128), ceil(K / 128)])."""
    return _quantize_last(w, 2)


def dequantize_weight(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 values of quantize_weight's outputs."""
    return codes.to(torch.float32) * _per_element(scales, codes.shape[-2:])


def fake_quantize_weight(w: torch.Tensor) -> torch.Tensor:
    """w rounded to 128x128-block FP8 and back, as fp32 (exact)."""
    return dequantize_weight(*quantize_weight(w))



# ------------------------------------------------ the kernels' layouts (ops.fp8_quantize_*)
#
# The CUDA kernels keep each power-of-two scale as its E8M0 code (e + 127; 255 for NaN):
# activation rows' scales transposed [ceil(K / 128), rows padded to 16], weights' as
# [E, ceil(N / 128), ceil(K / 128)]. These turn them back into values, for tests and benches.

def e8m0_values(codes: torch.Tensor) -> torch.Tensor:
    """fp32 2^(code - 127) built from the bits (exact, 2^-127 included), NaN for code 255."""
    c = codes.to(torch.int32)
    v = torch.where(c == 0, torch.full_like(c, 0x400000), c << 23).view(torch.float32)
    return torch.where(c == 255, torch.full_like(v, float("nan")), v)


def engine_row_values(codes: torch.Tensor, scales_t: torch.Tensor,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of ops.fp8_quantize_rows' (codes [rows, K], scale codes [k_blocks, >= rows])."""
    rows, k = codes.shape
    s = e8m0_values(scales_t[:, :rows]).t().repeat_interleave(BLOCK, 1)[:, :k]
    return (codes.to(torch.float32) * s).to(dtype)


def engine_weight_values(codes: torch.Tensor, scales: torch.Tensor,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of ops.fp8_quantize_weight_blocks' (codes [E, N, K], scale codes per block), a
    few matrices at a time (a full DeepSeek layer's fp32 copy would not fit beside it)."""
    E, n, k = codes.shape
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    for e in range(0, E, 8):
        s = e8m0_values(scales[e:e + 8]).repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)
        out[e:e + 8] = codes[e:e + 8].to(torch.float32) * s[:, :n, :k]
    return out

def fake_quantize_segments(x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """wgrad's operand x [rows, C] rounded to 128x1-block FP8 along its rows, each expert's
    segment rows offsets[e]:offsets[e + 1] on its own (offsets: int prefix sums [E + 1] from 0
    to rows), and back, as fp32."""
    bounds = [int(o) for o in offsets]
    if bounds[0] != 0 or bounds[-1] != x.shape[0] or any(a > b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"offsets must rise from 0 to the {x.shape[0]} rows of x; got {bounds}")
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    for a, b in zip(bounds, bounds[1:]):
        out[a:b] = fake_quantize_rows(x[a:b], dim=0)
    return out


# ----------------------------------------------------------------------------- the expert MLP
#
# One expert on its rows under the blockwise recipe. Every GEMM multiplies FP8-rounded operands
# (Qr: 1x128 blocks along the named reduction dimension; Qw: the weight's 128x128 blocks; Qn:
# 128x1 blocks along the expert's rows, from its first row), with the products of the
# dequantized values accumulated in fp32 (fp64 for fp64 inputs) and the result rounded to
# x's dtype:
#   forward   h  = round(Qr_H(x) Qw(W1)^T)            x [n, H], W1 [F1, H]
#             a  = round(act(h) * p)                   (as the BF16 recipe)
#             o  = round(Qr_F(a) Qw(W2)^T)             a [n, F], W2 [H, F]
#   dgrad     dA = round(Qr_H(dO) Qw(W2))              the same W2 values as forward
#             dh, dp: the activation backward of the BF16 recipe, from dA
#             dX = round(Qr_F1(dh) Qw(W1))             the same W1 values as forward
#   wgrad     dW2 = round(Qn(dO)^T Qn(a))
#             dW1 = round(Qn(dh)^T Qn(x))
# h, a, o, dA, dh and every output stay in x's dtype (BF16): quantization happens only where a
# GEMM reads. The last block of H, F, F1 or of the expert's rows is short when that size is not
# a multiple of 128.


def _matmul(qa: torch.Tensor, qb: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """round(qa @ qb) of fake-quantized (fp32) operands, accumulated in fp32 (fp64 for fp64
    outputs)."""
    acc = accumulation_dtype(out_dtype)
    return (qa.to(acc) @ qb.to(acc)).to(out_dtype)


# Activations and gradients in 1 x 128 blocks along the row, weights in 128 x 128 blocks;
# wgrad's operands in 128 x 1 blocks along the rows - all of one expert here, one segment from
# the first row (quantized_mlp.py has the chain).
GEMMS = QuantizedGemms(
    forward=lambda rows, w, dt: _matmul(fake_quantize_rows(rows), fake_quantize_weight(w).t(), dt),
    dgrad=lambda grad, w, dt: _matmul(fake_quantize_rows(grad), fake_quantize_weight(w), dt),
    wgrad=lambda grad, rows, dt: _matmul(fake_quantize_rows(grad, 0).t(),
                                         fake_quantize_rows(rows, 0), dt),
)


def expert_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, probs: torch.Tensor,
               activation: str = "swiglu") -> torch.Tensor:
    """One expert on its rows under the blockwise FP8 recipe (the section above);
    differentiable in x, w1, w2 and probs."""
    return quantized_mlp.expert_mlp(x, w1, w2, probs, activation, GEMMS)
