"""Local expert weights as stacked [E_local, rows, cols] views for the grouped GEMMs.

Callers pass either two stacked tensors or two sequences of per-expert tensors (Megatron keeps
one Parameter per expert). When the per-expert tensors already sit in one storage at a uniform
stride (as in a contiguous parameter buffer, in either order) the stacked view costs nothing:
``order[j]`` names the expert in row j, and the schedule orders rows by that position.
Otherwise they are stacked by a copy each call, and a one-time warning says how many bytes that
moves, so the cost is never silent. FC1 and FC2 always share one order.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch

log = logging.getLogger(__name__)
_warned: set[tuple] = set()


def _uniform_view(ws: Sequence[torch.Tensor]):
    """(view, order) if the tensors are one storage at a uniform stride, else None. Their
    shapes, dtypes and devices are equal already (inputs.check_call)."""
    first = ws[0]
    if not all(w.is_contiguous() for w in ws):
        return None
    ptr = first.untyped_storage().data_ptr()
    if not all(w.untyped_storage().data_ptr() == ptr for w in ws):
        return None
    order = sorted(range(len(ws)), key=lambda e: ws[e].storage_offset())
    starts = [ws[e].storage_offset() for e in order]
    step = starts[1] - starts[0] if len(ws) > 1 else first.numel()
    if step < first.numel() or any(b - a != step for a, b in zip(starts, starts[1:])):
        return None
    view = first.detach().as_strided((len(ws),) + tuple(first.shape),
                                     (step,) + tuple(first.stride()), starts[0])
    return view, order


def _stack_copy(ws: Sequence[torch.Tensor], order: list[int], name: str) -> torch.Tensor:
    key = (name, len(ws), tuple(ws[0].shape))
    if key not in _warned:
        _warned.add(key)
        nbytes = sum(w.numel() * w.element_size() for w in ws)
        log.warning("mok: %s of %d experts are not one uniformly strided storage; stacking them "
                    "copies %.1f MiB per call", name, len(ws), nbytes / 2**20)
    return torch.stack([ws[e].detach() for e in order])


def stack_expert_pair(w1, w2) -> tuple[torch.Tensor, torch.Tensor, Optional[list[int]]]:
    """-> (w1 [E, F1, H], w2 [E, H, F], order): stacked views (or copies) with row j holding
    expert order[j]; order is None when the inputs were stacked tensors already. The pair is
    checked already (inputs.check_call)."""
    if isinstance(w1, torch.Tensor):
        return w1, w2, None
    w1, w2 = list(w1), list(w2)
    views = [_uniform_view(w1), _uniform_view(w2)]
    found = [v for v in views if v is not None]
    order = found[0][1] if found else list(range(len(w1)))
    stacks = [v[0] if v is not None and v[1] == order else _stack_copy(ws, order, name)
              for v, ws, name in zip(views, (w1, w2), ("w1", "w2"))]
    return stacks[0], stacks[1], order
