"""The MoE layer of shared/DESIGN.md section 3 in plain PyTorch: the oracle for every kernel
and the backend wherever no kernel runs.

Per rank r of an expert-parallel group of W ranks (W = 1 without a group):
    x [T_r, H], expert ids [T_r, K] (-1 = unused slot), probs [T_r, K];
    E = W * E_local experts, expert e lives on rank e // E_local;
    local weights w1 [E_local, F1, H] (F1 = 2F as [gate | up] for gated activations, else F)
    and w2 [E_local, H, F], as stacked tensors or as sequences of per-expert tensors.
    y[t] = sum_k FC2_e(act(FC1_e(x[t])) * p[t, k]),  e = ids[t, k]
Probs are applied after the activation and before FC2, where Megatron applies them.

Numerics (the contract the kernels are checked against), with "round" meaning a cast to
x.dtype and all arithmetic in fp32 (fp64 when x is fp64):
    h = round(x @ w1^T); a = round(act(h) * p); o = round(a @ w2^T);
    y = round(o[:, 0] + o[:, 1] + ... + o[:, K-1])   (this order, fp32)
Every reduction has a fixed order (matmuls over whole operands, k-sums as explicit loops,
scatters to unique indices), so the same inputs give the same bits on every run, on CPU and
on GPU. Gradients (dx, dprobs, dw1, dw2) come from autograd through the same graph.
Expert parallelism uses ``all_to_all_single`` on any torch.distributed backend (gloo, NCCL)
and reads the token counts on the host: that is fine for an oracle, never for a kernel.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ..activations import get_activation
from ..inputs import MoECall, Weights, check_call, check_routing_values
from ..recipes import fp8_blockwise, mxfp8
from ..recipes.quantized_mlp import accumulation_dtype


def _matmul_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """round(a @ b^T) with fp32 (or fp64) accumulation."""
    acc = accumulation_dtype(a.dtype)
    return (a.to(acc) @ b.to(acc).t()).to(a.dtype)


def expert_mlp(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    probs: Optional[torch.Tensor],
    activation: str = "swiglu",
) -> torch.Tensor:
    """One expert on its rows: round(round(act(round(x w1^T)) * p) w2^T)."""
    act = get_activation(activation)
    acc = accumulation_dtype(x.dtype)
    h = _matmul_nt(x, w1)
    a = act(h.to(acc))
    if probs is not None:
        a = a * probs.to(acc).unsqueeze(-1)
    return _matmul_nt(a.to(x.dtype), w2)


# The routed experts' MLP per recipe precision.
_ROUTED_MLP = {"bf16": expert_mlp, "mxfp8": mxfp8.expert_mlp,
               "fp8_blockwise": fp8_blockwise.expert_mlp}


def sum_slots(slots: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """[T, K, H] -> [T, H]: slot 0 + slot 1 + ... in that order, in fp32, then rounded."""
    acc = slots[:, 0].to(accumulation_dtype(out_dtype))
    for k in range(1, slots.shape[1]):
        acc = acc + slots[:, k]
    return acc.to(out_dtype)


class _GatherRows(torch.autograd.Function):
    """rows = x[index // K] for slot indices; the backward sums each token's slot gradients in
    slot order (not with index_add, whose GPU accumulation order is not fixed)."""

    @staticmethod
    def forward(ctx, x, slot_index, topk):
        ctx.save_for_backward(slot_index)
        ctx.shape = (x.shape[0], topk, x.shape[1])
        return x.index_select(0, torch.div(slot_index, topk, rounding_mode="floor"))

    @staticmethod
    def backward(ctx, grad_rows):
        (slot_index,) = ctx.saved_tensors
        T, K, H = ctx.shape
        slots = grad_rows.new_zeros(T * K, H, dtype=accumulation_dtype(grad_rows.dtype))
        slots[slot_index] = grad_rows.to(slots.dtype)
        return sum_slots(slots.view(T, K, H), grad_rows.dtype), None, None


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over the first dim with host-known splits; backward is the reverse."""

    @staticmethod
    def forward(ctx, t, send_splits, recv_splits, group):
        ctx.splits = (send_splits, recv_splits)
        ctx.group = group
        return _all_to_all(t, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        return _all_to_all(grad.contiguous(), recv_splits, send_splits, ctx.group), None, None, None


def _all_to_all(t, send_splits, recv_splits, group):
    out = t.new_empty((sum(recv_splits),) + tuple(t.shape[1:]))
    # A pure copy, bit-exact in any dtype; gloo and NCCL both take bf16 (gloo rejects int16).
    dist.all_to_all_single(out, t.contiguous(), recv_splits, send_splits, group=group)
    return out


def stack_weights(w: Weights) -> torch.Tensor:
    """Per-expert tensors -> one stacked tensor (a differentiable copy); stacked stays as is."""
    return w if isinstance(w, torch.Tensor) else torch.stack(list(w))


def moe_reference(
    x: torch.Tensor,
    ids: torch.Tensor,
    probs: torch.Tensor,
    w1: Weights,
    w2: Weights,
    *,
    group: Optional[dist.ProcessGroup] = None,
    activation: str = "swiglu",
    shared: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> torch.Tensor:
    """The MoE layer forward on this rank (see the module docstring); differentiable."""
    world = 1 if group is None else dist.get_world_size(group)
    call = check_call(x, ids, probs, w1, w2, activation=activation, world=world)
    check_routing_values(call)
    return reference_forward(call, group, shared)


def reference_forward(call: MoECall, group: Optional[dist.ProcessGroup],
                      shared: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                      precision: str = "bf16") -> torch.Tensor:
    """moe_reference on a checked call (inputs.check_call, values included). `precision`:
    the recipe's; "mxfp8" and "fp8_blockwise" run the routed experts as mxfp8.expert_mlp and
    fp8_blockwise.expert_mlp document (the dispatch, combine and shared expert stay in x's
    dtype)."""
    routed_mlp = _ROUTED_MLP[precision]
    x, ids, probs, activation = call.x, call.ids, call.probs, call.activation
    world, num_local = call.world, call.num_local
    w1, w2 = stack_weights(call.w1), stack_weights(call.w2)
    T, K = ids.shape
    H = x.shape[1]

    # Slots (t, k) in flat order t*K + k, grouped by destination rank: stable within a rank.
    flat_ids = ids.reshape(-1).long()
    used = flat_ids >= 0
    dest = torch.where(used, torch.div(flat_ids, num_local, rounding_mode="floor"), world)
    order = torch.sort(dest, stable=True).indices
    send_counts = torch.bincount(dest, minlength=world + 1)[:world]
    slot_index = order[: int(send_counts.sum())]

    rows = _GatherRows.apply(x, slot_index, K)
    row_probs = probs.reshape(-1)[slot_index]
    row_expert = (flat_ids[slot_index] % num_local).to(torch.int32)

    if world > 1:
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        rows = _AllToAll.apply(rows, send, recv, group)
        row_probs = _AllToAll.apply(row_probs, send, recv, group)
        row_expert = _all_to_all(row_expert, send, recv, group)

    # Received rows are ordered (source rank, source slot); each expert takes its rows in
    # that order, and results go back to the rows they came from. Experts without rows run
    # too (on zero rows): that keeps every rank's autograd graph the same shape, so each
    # rank's backward reaches the same all-to-alls even when it received no rows at all.
    out = rows.new_zeros(rows.shape)
    for e in range(num_local):
        idx = (row_expert == e).nonzero().squeeze(1)
        o = routed_mlp(rows[idx], w1[e], w2[e], row_probs[idx], activation)
        out = out.index_put((idx,), o)

    if world > 1:
        out = _AllToAll.apply(out, recv, send, group)

    slots = out.new_zeros(T * K, H, dtype=accumulation_dtype(x.dtype))
    slots = slots.index_put((slot_index,), out.to(slots.dtype))
    y = sum_slots(slots.view(T, K, H), x.dtype)
    if shared is not None:
        y = y + expert_mlp(x, shared[0], shared[1], None, activation)
    return y
