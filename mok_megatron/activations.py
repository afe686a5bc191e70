"""Expert activations, named as in the recipes and Megatron's configs.

A gated activation reads FC1's output as [gate | up] (Megatron's order) and returns
act(gate) * up; a plain one applies act to the whole FC1 output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Activation:
    name: str
    gated: bool
    fn: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return self.fn(gate) * up
        return self.fn(h)

    def fc1_rows(self, ffn_hidden_size: int) -> int:
        """Rows of an expert's FC1 weight for a given FFN width."""
        return 2 * ffn_hidden_size if self.gated else ffn_hidden_size


def _squared_relu(h: torch.Tensor) -> torch.Tensor:
    return torch.pow(F.relu(h), 2)


ACTIVATIONS = {
    "swiglu": Activation("swiglu", True, F.silu),
    "geglu": Activation("geglu", True, F.gelu),
    "silu": Activation("silu", False, F.silu),
    "gelu": Activation("gelu", False, F.gelu),
    "relu": Activation("relu", False, F.relu),
    "squared_relu": Activation("squared_relu", False, _squared_relu),
}


def get_activation(name: str) -> Activation:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}"
        ) from None


def weighted_activation_backward(activation: str, h: torch.Tensor, probs: torch.Tensor,
                                 grad_a: torch.Tensor, acc: torch.dtype):
    """(dh, dprobs) of a = act(h) * p for the gradient grad_a, as the BF16 recipe's autograd
    computes them: `acc` (fp32 or fp64) math from the rounded grad_a, dh in h's dtype, dprobs
    in the probs' dtype. The quantized recipes' reference MLPs share it."""
    act = get_activation(activation)
    with torch.enable_grad():
        hh = h.detach().requires_grad_()
        pp = probs.detach().requires_grad_()
        a = act(hh.to(acc)) * pp.to(acc).unsqueeze(-1)
        return torch.autograd.grad(a, (hh, pp), grad_a.to(acc))
