"""MXFP8 (OCP microscaling) quantization, the reference every MXFP8 kernel is checked against
(shared/DESIGN.md section 5). Plain PyTorch, CPU or GPU.

A tensor is cut into blocks of BLOCK = 32 consecutive elements along one dimension (the
reduction dimension of the GEMM that reads it); each block gets one shared scale 2^e, stored as
an E8M0 byte (e + 127), and its elements are stored as FP8 E4M3 values v / 2^e.

Scale choice (Transformer Engine's MXFP8BlockScaling): e is the smallest exponent with
amax / 2^e <= 448 (E4M3's largest finite value), computed from the fp32 product
amax * fp32(1/448) by rounding its exponent up unless it is an exact power of two; e is
clamped to [-127, 127] (E8M0's finite range). fp32(1/448) is above 1/448, so the product is
never below amax / 448 by more than its own rounding and, for amax in E4M3-scaled range, no
scaled element exceeds 448 (tested); elements are still clamped to +-448 before the cast,
which would turn values past 464 into NaN. Elements: fp32(v) * 2^-e (exact: a power of
two), rounded to nearest-even E4M3. Dequantized: E4M3 value * 2^e, exact in fp32.

Edge cases, as tested:
  - an all-zero block: e = -127, elements 0 (dequantize to +0 / -0 as given);
  - subnormal inputs: their blocks get small exponents down to -127, where elements below
    E4M3's range round to 0;
  - a block with NaN or +-Inf: its scale byte is 255 (E8M0 NaN) and every element of the block
    dequantizes to NaN - a non-finite value poisons its block, never the rest of the tensor;
  - a dimension that is not a multiple of 32: the last block is shorter (its amax over the
    elements that exist).
"""

from __future__ import annotations

import torch

from . import quantized_mlp
from .quantized_mlp import QuantizedGemms, accumulation_dtype

BLOCK = 32
E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_NAN = 255
_RCP_E4M3_MAX = torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32).item()  # fp32(1/448)


def _blocks(x: torch.Tensor, dim: int, block: int) -> tuple[torch.Tensor, int]:
    """x (fp32) moved so `dim` is last and cut into [..., n_blocks, block], zero-padded."""
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    pad = (-n) % block
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], (n + pad) // block, block), n


def scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """int32 e per block for a finite fp32 amax >= 0 (module docstring): the exponent of
    amax * fp32(1/448) rounded up unless that product is a power of two, in [-127, 127]."""
    s = amax.to(torch.float32) * _RCP_E4M3_MAX
    bits = s.view(torch.int32)
    biased = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    # Normal s: exponent biased - 127, one more if the mantissa is non-zero. Subnormal or
    # zero s (biased 0) is below 2^-126: e clamps to -127 anyway.
    e = torch.where(biased > 0, biased - 127 + (mantissa != 0).to(torch.int32),
                    torch.full_like(biased, -127))
    return e.clamp(-E8M0_BIAS, E8M0_BIAS)


def quantize(x: torch.Tensor, dim: int = -1, block: int = BLOCK):
    """MXFP8 of x along `dim`: (values, float8_e4m3fn with x's shape; scales, uint8 E8M0 of
    x's shape with `dim` replaced by its number of blocks)."""
    xf, n = _blocks(x.to(torch.float32), dim, block)
    finite = torch.isfinite(xf).all(dim=-1)
    amax = torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf)).amax(dim=-1)
    e = scale_exponent(amax)
    scaled = xf * torch.exp2(-e.to(torch.float32)).unsqueeze(-1)
    q = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    codes = torch.where(finite, e + E8M0_BIAS, torch.full_like(e, E8M0_NAN)).to(torch.uint8)
    q = q.flatten(-2)[..., :n].movedim(-1, dim)
    return q, codes.movedim(-1, dim)


def dequantize(q: torch.Tensor, scales: torch.Tensor, dim: int = -1,
               block: int = BLOCK) -> torch.Tensor:
    """fp32 values of an MXFP8 tensor (quantize's outputs, the same dim and block)."""
    qf, n = _blocks(q.to(torch.float32), dim, block)
    codes = scales.movedim(dim, -1).to(torch.int32)
    scale = torch.exp2((codes - E8M0_BIAS).to(torch.float32))
    scale = torch.where(codes == E8M0_NAN, torch.full_like(scale, float("nan")), scale)
    out = qf * scale.unsqueeze(-1)
    return out.flatten(-2)[..., :n].movedim(-1, dim)


def fake_quantize(x: torch.Tensor, dim: int = -1, block: int = BLOCK) -> torch.Tensor:
    """x rounded to MXFP8 along `dim` and back, as fp32 (exact)."""
    return dequantize(*quantize(x, dim, block), dim=dim, block=block)


# ----------------------------------------------------------------------------- the expert MLP
#
# One expert on its rows under the MXFP8 recipe. Every GEMM multiplies MXFP8-rounded operands,
# each quantized along that GEMM's reduction dimension, with the products of the dequantized
# values accumulated in fp32 (fp64 for fp64 inputs) and the result rounded to x's dtype:
#   forward   h  = round(Q_H(x) Q_H(W1)^T)            x [n, H], W1 [F1, H]: blocks along H
#             a  = round(act(h) * p)                   (as the BF16 recipe)
#             o  = round(Q_F(a) Q_F(W2)^T)            a [n, F], W2 [H, F]: blocks along F
#   dgrad     dA = round(Q_H(dO) Q_H(W2))             W2 along H: its other orientation
#             dh, dp: the activation backward of the BF16 recipe, from dA
#             dX = round(Q_F1(dh) Q_F1(W1))           W1 along F1: its other orientation
#   wgrad     dW2 = round(Q_n(dO)^T Q_n(a))           blocks along the expert's rows n,
#             dW1 = round(Q_n(dh)^T Q_n(x))           starting at its first row
# h, a, o, dA, dh and every output stay in x's dtype (BF16): quantization happens only where a
# GEMM reads. A block never crosses the end of an operand's reduction dimension: rows of an
# expert are quantized per expert (its last block of rows may be short), and the last block of
# H, F or F1 is short when that size is not a multiple of 32.


def _qmm(a: torch.Tensor, b: torch.Tensor, dim_a: int, dim_b: int,
         out_dtype: torch.dtype) -> torch.Tensor:
    """round(Q(a) @ Q(b)) with a quantized along dim_a and b along dim_b (each its reduction
    dimension), accumulated in fp32 (fp64 for fp64 outputs)."""
    acc = accumulation_dtype(out_dtype)
    qa = fake_quantize(a, dim_a).to(acc)
    qb = fake_quantize(b, dim_b).to(acc)
    return (qa @ qb).to(out_dtype)


# Every GEMM of the recipe quantizes both operands along its reduction dimension
# (quantized_mlp.py has the chain).
GEMMS = QuantizedGemms(
    forward=lambda rows, w, dt: _qmm(rows, w.t(), 1, 0, dt),
    dgrad=lambda grad, w, dt: _qmm(grad, w, 1, 0, dt),
    wgrad=lambda grad, rows, dt: _qmm(grad.t(), rows, 1, 0, dt),
)


def expert_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, probs: torch.Tensor,
               activation: str = "swiglu") -> torch.Tensor:
    """One expert on its rows under the MXFP8 recipe (the section above); differentiable in
    x, w1, w2 and probs."""
    return quantized_mlp.expert_mlp(x, w1, w2, probs, activation, GEMMS)
