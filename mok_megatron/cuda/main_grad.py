"""Weight gradients added into Megatron's ``main_grad`` in place (gradient-accumulation fusion).

Megatron's DDP gives every Parameter an fp32 ``main_grad`` (a view into its gradient buffer)
and, after each Parameter's AccumulateGrad, adds ``param.grad`` into it - unless the layer
already did and said so with ``param.grad_added_to_main_grad = True``, as Megatron's own linears
do under ``--gradient-accumulation-fusion`` (tensor_parallel/layers.py). The expert
weight-gradient tiles then add their fp32 accumulators into ``main_grad``, one add
per element (an output tile is owned by one block, so the result is main_grad + dW exactly,
bit-identical run to run), and autograd gets the same placeholder gradients Megatron's linears
return: they keep DDP's per-parameter hook firing (its bucket's reduce is started from there)
while the hook skips its add.

Used where Megatron's linears would fuse too - the flag is on and every expert weight has a
``main_grad`` - with fp32 main_grads, on either backward: the backward megakernel's tiles, or
the separate backward's weight-gradient launch (ops.grouped_wgrad_accumulate: the same tiles
on their own), so every recipe keeps Megatron's numerics (TE's grouped linears accumulate the
weight gradient in fp32 too). With bf16 main_grads the gradients go through autograd in bf16
and DDP adds them, as Megatron does (said once in the log).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

log = logging.getLogger(__name__)
_said: set[str] = set()
_tables: dict[tuple, torch.Tensor] = {}


@dataclass(frozen=True)
class MainGradTargets:
    params: tuple  # the autograd weight inputs whose main_grad receives their gradient
    dw1: torch.Tensor  # int64 [E_local] main_grad address of each stacked row of w1
    dw2: torch.Tensor  # int64 [E_local] of w2


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning("mok: %s", message)


def _address_table(grads: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Cached per set of addresses (Megatron's main_grads never move), so a call inside a CUDA
    graph capture copies nothing from the host once an eager call has run."""
    key = (tuple(g.data_ptr() for g in grads), device)
    if key not in _tables:
        _tables[key] = torch.tensor(key[0], dtype=torch.int64, device=device)
    return _tables[key]


def _check_main_grad(name: str, weight: torch.Tensor, grad: torch.Tensor) -> None:
    if (grad.shape != weight.shape or grad.device != weight.device
            or not grad.is_contiguous()):
        raise ValueError(
            f"{name}.main_grad is {tuple(grad.shape)} on {grad.device} "
            f"({'' if grad.is_contiguous() else 'not '}contiguous); gradient-accumulation fusion "
            f"needs a contiguous main_grad of the weight's shape {tuple(weight.shape)} on "
            f"{weight.device}")


def main_grad_targets(params: tuple, order: Optional[list]) -> Optional[MainGradTargets]:
    """`params`: the call's autograd weight inputs - (w1, w2) stacked, or every expert's w1
    then every expert's w2; `order`: the expert in each stacked row
    (expert_weights.stack_expert_pair), None for stacked weights. None where the fusion does
    not apply."""
    grads = [getattr(p, "main_grad", None) for p in params]
    if any(g is None for g in grads):
        return None  # as Megatron's linears: fused only where main_grad exists
    for i, (p, g) in enumerate(zip(params, grads)):
        _check_main_grad(f"expert weight {i}", p, g)
    if any(g.dtype != torch.float32 for g in grads):
        _say_once("gradient-accumulation fusion with non-fp32 main_grads: the expert weight "
                  "gradients are bf16 and DDP adds them")
        return None
    device = grads[0].device
    if order is None:  # one stacked main_grad per weight: its rows, in order
        rows = [list(g.unbind(0)) for g in grads]
    else:  # the w1s, then the w2s, each in stacked order
        half = len(grads) // 2
        rows = [[grads[offset + e] for e in order] for offset in (0, half)]
    return MainGradTargets(params, _address_table(rows[0], device),
                           _address_table(rows[1], device))


def placeholder_grads(targets: MainGradTargets) -> tuple:
    """What autograd gets for weights whose gradient is in main_grad already: Megatron's
    protocol (a placeholder gradient and grad_added_to_main_grad = True where DDP tracks the
    flag, zeros where it asks for them with zero_out_wgrad), None where nothing tracks it."""
    grads = []
    for p in targets.params:
        if not hasattr(p, "grad_added_to_main_grad"):
            grads.append(None)
            continue
        make = torch.zeros if getattr(p, "zero_out_wgrad", False) else torch.empty
        grads.append(make(p.shape, dtype=p.dtype, device=p.device))
        p.grad_added_to_main_grad = True
    return tuple(grads)
