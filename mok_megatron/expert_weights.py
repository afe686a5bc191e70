"""Local expert weights as one stacked [E_local, rows, cols] view for the grouped GEMMs.

Megatron keeps one Parameter per expert. When those Parameters already sit in one storage at
a uniform stride (as in a contiguous parameter buffer, in either order) the stacked view costs
nothing: ``position[e]`` says where expert e sits in it, and the schedule orders rows by that
position. Otherwise the weights are stacked by a copy each call, and a one-time warning says
how many bytes that moves, so the cost is never silent.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

log = logging.getLogger(__name__)
_warned: set[tuple] = set()


def _uniform_view(ws: Sequence[torch.Tensor]):
    first = ws[0]
    if not all(w.shape == first.shape and w.dtype == first.dtype and w.device == first.device
               and w.is_contiguous() for w in ws):
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


def stack_experts(ws, name: str):
    """-> (stacked [E, r, c] tensor, order) with stacked[j] == ws[order[j]]."""
    if isinstance(ws, torch.Tensor):
        return ws, list(range(ws.shape[0]))
    ws = list(ws)
    found = _uniform_view(ws)
    if found is not None:
        return found
    key = (name, len(ws), tuple(ws[0].shape))
    if key not in _warned:
        _warned.add(key)
        nbytes = sum(w.numel() * w.element_size() for w in ws)
        log.warning("mok: %s of %d experts are not one uniformly strided storage; stacking them "
                    "copies %.1f MiB per call", name, len(ws), nbytes / 2**20)
    return torch.stack([w.detach() for w in ws]), list(range(len(ws)))
