"""One expert's MLP under a quantized recipe, the reference backend's (mxfp8.py,
fp8_blockwise.py): the BF16 reference's chain (reference.expert_mlp) with each of its six GEMMs
multiplying its operands as the recipe quantizes them, forward and backward,

    forward   h  = gemm.forward(x, W1)       out = gemm.forward(act, W2)
    dgrad     dA = gemm.dgrad(dY, W2)        dX  = gemm.dgrad(dh, W1)
    wgrad     dW2 = gemm.wgrad(dY, act)      dW1 = gemm.wgrad(dh, x)

h, act, dA, dh and every output stay in x's dtype: quantization happens only where a GEMM
reads. All rows given are one expert's (a wgrad's blocks along the rows start at the first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..activations import get_activation, weighted_activation_backward


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """What every reference GEMM and sum accumulates in for outputs of `dtype`."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# (operand, operand, out dtype) -> round(product) accumulated in accumulation_dtype(out dtype).
Gemm = Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]


@dataclass(frozen=True)
class QuantizedGemms:
    """A recipe's three kinds of GEMM, each quantizing its operands along its reduction
    dimension as the recipe says."""

    forward: Gemm  # (rows [n, K], weight [N, K]) -> Q(rows) Q(weight)^T
    dgrad: Gemm    # (gradient rows [n, N], weight [N, K]) -> Q(grad) Q(weight)
    wgrad: Gemm    # (gradient rows [n, N], rows [n, K]) -> Q(grad)^T Q(rows), K = the rows


class _ExpertMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, w2, probs, activation, gemm: QuantizedGemms):
        acc = accumulation_dtype(x.dtype)
        h = gemm.forward(x, w1, x.dtype)
        a = (get_activation(activation)(h.to(acc)) * probs.to(acc).unsqueeze(-1)).to(x.dtype)
        o = gemm.forward(a, w2, x.dtype)
        ctx.save_for_backward(x, w1, w2, probs, h, a)
        ctx.activation, ctx.gemm = activation, gemm
        return o

    @staticmethod
    def backward(ctx, grad_o):
        x, w1, w2, probs, h, a = ctx.saved_tensors
        gemm, dt = ctx.gemm, x.dtype
        grad_o = grad_o.to(dt)
        d_a = gemm.dgrad(grad_o, w2, dt)
        d_h, d_p = weighted_activation_backward(ctx.activation, h, probs, d_a,
                                                accumulation_dtype(dt))
        d_x = gemm.dgrad(d_h, w1, dt)
        d_w2 = gemm.wgrad(grad_o, a, dt)
        d_w1 = gemm.wgrad(d_h, x, dt)
        return d_x, d_w1, d_w2, d_p, None, None


def expert_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, probs: torch.Tensor,
               activation: str, gemm: QuantizedGemms) -> torch.Tensor:
    """One expert on its rows with `gemm`'s GEMMs; differentiable in x, w1, w2 and probs."""
    return _ExpertMLP.apply(x, w1, w2, probs, activation, gemm)
