"""An expert-parallel layer seen as one function of the global tensors, for gradcheck.

gradcheck perturbs one input element at a time and compares the change of the outputs with
what backward says. On an EP group a rank's output also depends on other ranks' weights, and
backward on one rank receives gradient from every rank's output, so a per-rank gradcheck
would compare different things. Instead every rank checks the same global function in
lockstep: global inputs -> this rank's rows (and experts) -> layer -> every rank's output,
replicated on all ranks. Gradients stay exact: the only sums add zeros.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist


class _TakeRows(torch.autograd.Function):
    """Rows [start, stop) of a tensor replicated on all ranks; backward assembles the
    gradient of the whole tensor from every rank's rows."""

    @staticmethod
    def forward(ctx, full, start, stop, group):
        ctx.args = (full.shape, start, stop, group)
        return full[start:stop].clone()

    @staticmethod
    def backward(ctx, grad):
        shape, start, stop, group = ctx.args
        full = grad.new_zeros(shape)
        full[start:stop] = grad
        dist.all_reduce(full, group=group)
        return full, None, None, None


class _GatherRows(torch.autograd.Function):
    """Every rank's rows, concatenated and replicated; backward keeps this rank's rows."""

    @staticmethod
    def forward(ctx, rows, start, num_rows, group):
        ctx.span = (start, start + rows.shape[0])
        full = rows.new_zeros((num_rows,) + tuple(rows.shape[1:]))
        full[start : start + rows.shape[0]] = rows
        dist.all_reduce(full, group=group)
        return full

    @staticmethod
    def backward(ctx, grad):
        start, stop = ctx.span
        return grad[start:stop].contiguous(), None, None, None


def global_view(
    layer: Callable[..., torch.Tensor],
    tokens_per_rank: tuple[int, ...],
    num_experts: int,
    rank: int,
    group: dist.ProcessGroup,
) -> Callable[..., torch.Tensor]:
    """f(x, probs, w1, w2) on global tensors = concatenated layer(local x, probs, w1, w2)."""
    start, stop = sum(tokens_per_rank[:rank]), sum(tokens_per_rank[: rank + 1])
    per_rank = num_experts // len(tokens_per_rank)
    first_expert = rank * per_rank

    def f(x, probs, w1, w2):
        y = layer(
            _TakeRows.apply(x, start, stop, group),
            _TakeRows.apply(probs, start, stop, group),
            _TakeRows.apply(w1, first_expert, first_expert + per_rank, group),
            _TakeRows.apply(w2, first_expert, first_expert + per_rank, group),
        )
        return _GatherRows.apply(y, start, x.shape[0], group)

    return f
