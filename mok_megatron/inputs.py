"""The one place a MoE layer call's inputs are checked, before anything is allocated or any
rank waits for another.

Every entry point (``functional.moe_experts``, ``reference.moe_reference``, the test entry
``symm_moe.moe_experts_on_workspace``) calls ``check_call`` first and hands the resulting
``MoECall`` on; nothing downstream checks again. The CUDA path adds what only its kernels need
(``symm_moe.check_kernel_call``) before it touches the workspace, so a bad input on one rank
fails there with its message instead of leaving its peers waiting in a barrier.

Value checks (expert ids in range, finite probs) read the tensors and so synchronize with the
device: the reference backend always runs them; the CUDA path runs them only with
``kernel.check_inputs`` (its schedule kernel checks every expert id on the GPU anyway and stops
with a report naming rank, token, slot and id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

from .activations import get_activation

Weights = Union[torch.Tensor, Sequence[torch.Tensor]]
UNUSED_SLOT = -1  # an expert id that marks an unused slot (a padding or dropped token)


@dataclass(frozen=True)
class MoECall:
    """A checked call: the tensors as given, and the sizes every backend plans from."""

    x: torch.Tensor  # [T, H]
    ids: torch.Tensor  # [T, K] int32 / int64
    probs: torch.Tensor  # [T, K] floating point
    w1: Weights  # [E_local, F1, H] stacked, or E_local tensors [F1, H]
    w2: Weights  # [E_local, H, F] stacked, or E_local tensors [H, F]
    activation: str
    world: int  # ranks of the expert-parallel group
    num_local: int  # experts on each rank

    @property
    def tokens(self) -> int:
        return self.x.shape[0]

    @property
    def topk(self) -> int:
        return self.ids.shape[1]

    @property
    def hidden(self) -> int:
        return self.x.shape[1]

    @property
    def ffn(self) -> int:
        return _shape(self.w2)[2]

    @property
    def num_experts(self) -> int:
        return self.world * self.num_local


def _shape(w: Weights) -> tuple[int, ...]:
    """[E_local, rows, cols] of stacked or per-expert weights (already checked)."""
    if isinstance(w, torch.Tensor):
        return tuple(w.shape)
    return (len(w), *w[0].shape)


def check_call(x, ids, probs, w1: Weights, w2: Weights, *, activation: str,
               world: int) -> MoECall:
    """Raise a ValueError / TypeError naming the first malformed input; return the call.
    Shapes, dtypes and devices only: nothing here reads a tensor's values."""
    act = get_activation(activation)
    _check_tokens_and_routing(x, ids, probs)
    num_local = _check_weight_pair(x, w1, w2, act)
    return MoECall(x, ids, probs, w1, w2, activation, world, num_local)


def check_routing_values(call: MoECall) -> None:
    """Expert ids in [0, E) or UNUSED_SLOT, probs finite. Reads the tensors (synchronizes)."""
    ids, probs = call.ids, call.probs
    if ids.numel() == 0:
        return
    bad = (ids < UNUSED_SLOT) | (ids >= call.num_experts)
    if bool(bad.any()):
        t, k = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"expert id {int(ids[t, k])} at token {t}, slot {k} is out of range "
            f"[0, {call.num_experts}) (use {UNUSED_SLOT} for an unused slot)"
        )
    finite = torch.isfinite(probs)
    if not bool(finite.all()):
        t, k = (int(v) for v in (~finite).nonzero()[0])
        raise ValueError(f"probs[{t}, {k}] is {float(probs[t, k])}: probs must be finite")


def _check_tokens_and_routing(x, ids, probs) -> None:
    for name, t in (("x", x), ("expert ids", ids), ("probs", probs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"expert ids must be [T, K] with T={x.shape[0]} (rows of x), got {tuple(ids.shape)}"
        )
    if ids.shape[1] < 1:
        raise ValueError("expert ids must have at least one slot per token (K >= 1)")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"expert ids must be int32 or int64, got {ids.dtype}")
    if probs.shape != ids.shape:
        raise ValueError(
            f"probs must have the shape of the expert ids {tuple(ids.shape)}, got "
            f"{tuple(probs.shape)}"
        )
    if not probs.is_floating_point():
        raise TypeError(f"probs must be a floating-point tensor, got {probs.dtype}")
    if ids.device != x.device or probs.device != x.device:
        raise ValueError(
            f"x, ids and probs must be on one device; got {x.device}, {ids.device}, {probs.device}"
        )


def _check_experts(name: str, w: Weights, dims: str) -> None:
    """Stacked [E_local, ...] or a non-empty sequence of equal per-expert tensors."""
    if isinstance(w, torch.Tensor):
        if w.dim() != 3 or w.shape[0] < 1:
            raise ValueError(f"stacked {name} must be {dims} with E_local >= 1, got "
                             f"{tuple(w.shape)}")
        return
    if not isinstance(w, (list, tuple)) or not w:
        raise TypeError(f"{name} must be a stacked tensor {dims} or a non-empty list of "
                        f"per-expert tensors, got {type(w).__name__}")
    first = w[0]
    if not isinstance(first, torch.Tensor) or first.dim() != 2:
        raise ValueError(f"{name}[0] must be a 2-D tensor (one expert of {dims})")
    # One pass, on every call (a Megatron layer passes one Parameter per expert): equal to the
    # first in shape, dtype and device; the message is built only for the first that is not.
    shape, dtype, device = first.shape, first.dtype, first.device
    try:
        e = next((e for e, t in enumerate(w)
                  if t.shape != shape or t.dtype != dtype or t.device != device), None)
    except AttributeError:  # an element that is no tensor (isinstance per element costs more)
        e = next(e for e, t in enumerate(w) if not isinstance(t, torch.Tensor))
    if e is not None:
        t = w[e]
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name}[{e}] must be a 2-D tensor (one expert of {dims})")
        raise ValueError(
            f"{name}[{e}] is {tuple(t.shape)} {t.dtype} on {t.device} but {name}[0] is "
            f"{tuple(shape)} {dtype} on {device}")


def _check_weight_pair(x, w1: Weights, w2: Weights, act) -> int:
    if isinstance(w1, torch.Tensor) != isinstance(w2, torch.Tensor):
        raise ValueError("w1 and w2 must both be stacked tensors or both sequences of "
                         "per-expert tensors")
    _check_experts("w1", w1, "[E_local, F1, H]")
    _check_experts("w2", w2, "[E_local, H, F]")
    s1, s2 = _shape(w1), _shape(w2)
    if s1[0] != s2[0]:
        raise ValueError(f"w1 has {s1[0]} experts but w2 has {s2[0]}")
    H, F = x.shape[1], s2[2]
    if s1[1:] != (act.fc1_rows(F), H):
        raise ValueError(
            f"w1 must be [E_local, {act.fc1_rows(F)}, {H}] for {act.name} with H={H}, "
            f"F={F}; got {s1}"
        )
    if s2[1] != H:
        raise ValueError(f"w2 must be [E_local, {H}, F]; got {s2}")
    for name, w in (("w1", w1), ("w2", w2)):
        t = w if isinstance(w, torch.Tensor) else w[0]
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device} but x is {x.dtype} on {x.device}")
    return s1[0]
