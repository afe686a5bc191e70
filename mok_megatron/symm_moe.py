"""GPU path v1: dispatch -> experts -> combine over symmetric memory, as separate kernels.

No host synchronization anywhere in forward or backward: the per-expert row counts exist only
on the GPU, the grouped GEMMs (``torch._grouped_mm``) take device-side offsets, and the row
movers and epilogues read the row count from device memory. Per call, on each rank:

forward   publish x, ids, probs, T into the workspace | barrier
          schedule: every rank's routing -> per-expert row lists (GPU counting sort)
          pull x rows from their source ranks | FC1 | act * p | FC2
          push result rows to (source rank, token, k) slots | barrier
          fixed-order k-sum of our own slots -> y
backward  publish dY (and x again, if recomputing) | barrier | pull dY rows
          [recomputing: pull x rows, h = FC1 exactly as forward computed it]
          dA = dY W2 | act backward (dh, dp)
          dX rows = dh W1, pushed with dp to the source slots | dW1, dW2 | barrier
          fixed-order k-sum -> dx; slot dprobs -> dprobs

Row buffers are sized for the worst case (every slot of every rank routed here), so any
skew fits; only the rows that exist are computed and moved. What forward keeps for backward
is the recipe's kernel.backward_inputs: the rows and h themselves ("saved", worst-case sized),
or only the schedule ("recomputed").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from . import ops
from .config import Recipe
from .expert_weights import stack_expert_pair
from .inputs import MoECall, check_call, check_routing_values
from .workspace import Workspace, WorkspaceLayout, get_workspace


@dataclass
class _Plan:
    ws: Workspace
    activation: str
    num_local: int
    w1: torch.Tensor  # [E_local, F1, H] stacked view, row j = expert order[j]
    w2: torch.Tensor  # [E_local, H, F]
    order: Optional[list]  # None: the weights came as stacked tensors (identity order)
    position: torch.Tensor  # int32 [E_local] on the device: expert -> its row in the views
    megakernel: bool  # forward in one persistent launch (recipe kernel.forward_kernel)
    comm_blocks: int  # blocks of that launch that pull rows
    recompute: bool  # backward pulls the rows again and recomputes h (kernel.backward_inputs)
    ring_mblocks: int  # m-blocks per macrobatch of the megakernel's ring; 0: no ring
    minibatch_rows: int  # megakernel: rows its pull publishes together
    schedule_capacity: float  # rows of the schedule and forward buffers, of the worst case


_positions: dict[tuple, torch.Tensor] = {}


def _expert_position(order: list, device: torch.device) -> torch.Tensor:
    """Cached, so a call never copies from the host (CUDA-graph capture forbids it)."""
    key = (tuple(order), device)
    if key not in _positions:
        position = [0] * len(order)
        for j, e in enumerate(order):
            position[e] = j
        _positions[key] = torch.tensor(position, dtype=torch.int32, device=device)
    return _positions[key]


def schedule_rows(world: int, max_tokens: int, topk: int, capacity: float) -> int:
    """Rows a rank's schedule holds: `capacity` (kernel.schedule_capacity) of the worst case,
    every slot of every rank routed to it."""
    worst = world * max_tokens * topk
    return max(1, min(worst, math.ceil(capacity * worst)))


def _schedule(ws: Workspace, topk: int, num_local: int, position: torch.Tensor,
              capacity: float):
    """Rows this rank owns, in (expert position, source rank, token, k) order: offsets, and
    per row its flat (source, token, k) slot and router prob (one GPU counting sort)."""
    rows = schedule_rows(ws.world, ws.layout.max_tokens, topk, capacity)
    offsets = torch.empty(num_local + 1, dtype=torch.int32, device=ws.device)
    row_slot = torch.empty(rows, dtype=torch.int32, device=ws.device)
    row_prob = torch.empty(rows, dtype=torch.float32, device=ws.device)
    o = ws.offsets
    ops.build_schedule(ws.peer_bases, o["ids"], o["probs"], o["count"], ws.world,
                       ws.layout.max_tokens, topk, ws.rank * num_local, position, offsets,
                       row_slot, row_prob)
    return offsets, row_slot, row_prob


def _grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offs)


def _pull(ws: Workspace, region: str, offsets, row_slot, topk: int) -> torch.Tensor:
    """This rank's schedule rows, pulled from `region` ([max_tokens, H] per rank) of every
    rank's workspace; rows past the schedule's end are left unwritten."""
    rows = torch.empty(row_slot.numel(), ws.layout.hidden, dtype=torch.bfloat16,
                       device=row_slot.device)
    ops.pull_rows(ws.peer_bases, ws.offsets[region], row_slot, offsets[-1:],
                  ws.layout.max_tokens, topk, rows)
    return rows


class _SymmMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ids, probs, plan: _Plan, *weights):
        ws = plan.ws
        T, H = x.shape
        K = ids.shape[1]
        ids32 = torch.empty(T, K, dtype=torch.int32, device=x.device)
        ops.publish_inputs(x, ids.contiguous(), probs.contiguous(), ws.buffer, ws.offsets,
                           ids32)
        ws.barrier(ops.Stage.FORWARD_PUBLISHED)

        offsets, row_slot, row_prob = _schedule(ws, K, plan.num_local, plan.position,
                                                plan.schedule_capacity)
        num_rows = offsets[plan.num_local:]
        offs = offsets[1:]
        cap = row_slot.numel()
        max_tokens = ws.layout.max_tokens

        ffn = plan.w2.shape[2]
        if plan.megakernel:
            # When backward recomputes, rows and act are only transient: a ring of macrobatches
            # bounds them whatever the routing, and h is not stored at all.
            n = (ops.macrobatch_ring_rows(cap, plan.num_local, plan.ring_mblocks)
                 if plan.ring_mblocks else cap)
            rows = torch.empty(n, H, dtype=torch.bfloat16, device=x.device)
            act = torch.empty(n, ffn, dtype=torch.bfloat16, device=x.device)
            h = None if plan.recompute else torch.empty(cap, plan.w1.shape[1],
                                                        dtype=torch.bfloat16, device=x.device)
            counters = ops.megakernel_counters(cap, plan.num_local, x.device,
                                               plan.ring_mblocks)
            ops.moe_forward_megakernel(ws.peer_bases, ws.offsets["tokens"], ws.offsets["slots"],
                                       offsets, row_slot, row_prob, max_tokens, K, plan.w1,
                                       plan.w2, plan.activation, rows, act, h, counters,
                                       plan.comm_blocks, ws.timeout_ns,
                                       minibatch_rows=plan.minibatch_rows,
                                       ring_mblocks=plan.ring_mblocks, rank=ws.rank)
        else:
            act = torch.empty(cap, ffn, dtype=torch.bfloat16, device=x.device)
            rows = _pull(ws, "tokens", offsets, row_slot, K)
            h = _grouped(rows, plan.w1.transpose(1, 2), offs)
            ops.activation_forward(h, row_prob, num_rows, plan.activation, act)
            out_rows = _grouped(act, plan.w2.transpose(1, 2), offs)
            ops.push_rows(ws.peer_bases, ws.offsets["slots"], row_slot, num_rows,
                          max_tokens * K, out_rows)
        ws.barrier(ops.Stage.FORWARD_COMBINED)

        y = torch.empty(T, H, dtype=x.dtype, device=x.device)
        ops.reduce_slots(ws.slots(T, K), ids32, y)
        ctx.plan = plan
        ctx.probs_dtype = probs.dtype
        if plan.recompute:
            # x is the layer's input, alive anyway; nothing here is sized by the routing.
            ctx.save_for_backward(ids32, x, offsets, row_slot, row_prob)
        else:
            ctx.save_for_backward(ids32, rows, h, offsets, row_slot, row_prob)
        return y

    @staticmethod
    def backward(ctx, dy):
        plan = ctx.plan
        ws = plan.ws
        if plan.recompute:
            ids32, x, offsets, row_slot, row_prob = ctx.saved_tensors
        else:
            ids32, rows, h, offsets, row_slot, row_prob = ctx.saved_tensors
        T, K = ids32.shape
        num_rows = offsets[plan.num_local:]
        offs = offsets[1:]
        cap, H = row_slot.numel(), dy.shape[1]
        max_tokens = ws.layout.max_tokens
        ws.tokens(T).copy_(dy)
        if plan.recompute:
            ws.inputs(T).copy_(x)
        ws.barrier(ops.Stage.BACKWARD_PUBLISHED)
        if plan.recompute:
            rows, h = _recompute_rows_and_h(plan, offsets, row_slot, row_prob, K)

        dout = _pull(ws, "tokens", offsets, row_slot, K)
        dact = _grouped(dout, plan.w2, offs)
        dh = torch.empty_like(h)
        act = torch.empty_like(dact)
        drow_prob = torch.empty(cap, dtype=torch.float32, device=dy.device)
        ops.activation_backward(h, dact, row_prob, num_rows, plan.activation, dh, act,
                                drow_prob)
        drows = _grouped(dh, plan.w1, offs)
        ops.push_rows(ws.peer_bases, ws.offsets["slots"], row_slot, num_rows, max_tokens * K,
                      drows)
        ops.push_values(ws.peer_bases, ws.offsets["slot_values"], row_slot, num_rows,
                        max_tokens * K, drow_prob)
        # Weight gradients while the peers finish their pushes.
        dw2 = _grouped(dout.t(), act, offs)
        dw1 = _grouped(dh.t(), rows, offs)
        ws.barrier(ops.Stage.BACKWARD_COMBINED)

        dx = torch.empty(T, H, dtype=dy.dtype, device=dy.device)
        ops.reduce_slots(ws.slots(T, K), ids32, dx)
        dprobs = torch.empty(T, K, dtype=torch.float32, device=dy.device)
        ops.gather_slot_values(ws.slot_values(T, K), ids32, dprobs)
        return (dx, None, dprobs.to(ctx.probs_dtype), None,
                *_split(dw1, plan.order), *_split(dw2, plan.order))


def _recompute_rows_and_h(plan: _Plan, offsets, row_slot, row_prob, topk: int):
    """The rows and h forward had, bit for bit: the token rows pulled again from the peers'
    republished inputs, and FC1 by the same kernel forward used (the megakernel's FC1 tiles
    are the tile engine's, so the standalone engine reproduces them)."""
    ws = plan.ws
    cap = row_slot.numel()
    rows = _pull(ws, "inputs", offsets, row_slot, topk)
    if plan.megakernel:
        h = torch.empty(cap, plan.w1.shape[1], dtype=torch.bfloat16, device=rows.device)
        act = torch.empty(cap, plan.w2.shape[2], dtype=torch.bfloat16, device=rows.device)
        ops.grouped_gemm(rows, plan.w1, offsets, act, row_prob=row_prob,
                         activation=plan.activation, h_out=h, timeout_ns=ws.timeout_ns,
                         rank=ws.rank)
    else:
        h = _grouped(rows, plan.w1.transpose(1, 2), offsets[1:])
    return rows, h


def _split(dw: torch.Tensor, order: Optional[list]):
    """Stacked gradient -> the autograd inputs it belongs to (one stacked, or per expert)."""
    if order is None:
        return (dw,)
    grads = [None] * len(order)
    for j, e in enumerate(order):
        grads[e] = dw[j]
    return tuple(grads)


def check_kernel_call(call: MoECall, recipe: Recipe) -> None:
    """What the kernels need beyond what every backend checks (inputs.check_call): before the
    workspace is allocated, so a bad input never leaves peers waiting in a rendezvous."""
    if call.x.dtype != torch.bfloat16:
        raise ValueError(f"the cuda backend runs bf16 activations and weights; x is {call.x.dtype}")
    if call.activation not in ops.ACTIVATION_IDS:
        raise ValueError(f"activation {call.activation!r} is not implemented by the cuda backend")
    if call.hidden % 8 or call.ffn % 8:
        raise ValueError(f"the cuda backend needs H and F to be multiples of 8; got "
                         f"H={call.hidden}, F={call.ffn}")
    limit = recipe.kernel.max_tokens_per_rank
    if call.tokens > limit:
        raise ValueError(
            f"{call.tokens} tokens on this rank exceed the workspace bound "
            f"kernel.max_tokens_per_rank={limit} of recipe {recipe.name!r}; raise it")
    if call.world > ops.MAX_RANKS:
        raise ValueError(f"EP={call.world}: the cuda backend supports at most {ops.MAX_RANKS} GPUs")
    if call.num_local > ops.MAX_LOCAL_EXPERTS:
        raise ValueError(f"{call.num_local} experts per rank: the cuda backend supports at most "
                         f"{ops.MAX_LOCAL_EXPERTS}")


def workspace_layout(topk: int, hidden: int, recipe: Recipe) -> WorkspaceLayout:
    return WorkspaceLayout(recipe.kernel.max_tokens_per_rank, topk, hidden,
                           inputs=recipe.kernel.backward_inputs == "recomputed")


def moe_experts_cuda(call: MoECall, group: Optional[dist.ProcessGroup],
                     recipe: Recipe) -> torch.Tensor:
    """A checked call (inputs.check_call) on the group's workspace, created on first use."""
    check_kernel_call(call, recipe)
    ws = get_workspace(group, call.x.device, workspace_layout(call.topk, call.hidden, recipe),
                       recipe.kernel.spin_timeout_ms)
    return _run(ws, call, recipe)


def moe_experts_on_workspace(ws: Workspace, x, ids, probs, w1, w2, *, activation: str,
                             recipe: Recipe) -> torch.Tensor:
    """The cuda backend on a given workspace (one of Workspace.emulated_group's in tests): an
    entry point of its own, so it checks its inputs as moe_experts does."""
    call = check_call(x, ids, probs, w1, w2, activation=activation, world=ws.world)
    if recipe.kernel.check_inputs:
        check_routing_values(call)
    check_kernel_call(call, recipe)
    if not ws.layout.matches(workspace_layout(call.topk, call.hidden, recipe)):
        raise ValueError("the workspace's layout does not match this call's shapes and recipe")
    return _run(ws, call, recipe)


def _run(ws: Workspace, call: MoECall, recipe: Recipe) -> torch.Tensor:
    w1_stack, w2_stack, order = stack_expert_pair(call.w1, call.w2)
    knobs = recipe.kernel
    megakernel = knobs.forward_kernel == "megakernel"
    recompute = knobs.backward_inputs == "recomputed"
    # The ring runs only where forward keeps nothing for backward (config.py says so too).
    ring_mblocks = (-(-knobs.macrobatch_tokens // ops.MEGAKERNEL_BLOCK_M)
                    if megakernel and recompute else 0)
    position = _expert_position(order or list(range(call.num_local)), call.x.device)
    plan = _Plan(ws, call.activation, call.num_local, w1_stack, w2_stack, order, position,
                 megakernel, knobs.comm_sms_forward, recompute, ring_mblocks,
                 knobs.minibatch_tokens, knobs.schedule_capacity)
    w_inputs = (call.w1, call.w2) if order is None else (*call.w1, *call.w2)
    return _SymmMoE.apply(call.x.contiguous(), call.ids, call.probs, plan, *w_inputs)
