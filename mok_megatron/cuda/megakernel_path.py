"""The megakernel path: the expert stage of a MoE call as one persistent kernel each way
(both under every recipe; under the FP8 recipes with recomputed backward inputs:
config.recipe_problems).

forward   csrc/megakernel/moe_forward.cu: pull x rows | FC1 + act * p | FC2 | push result
          rows to their (source rank, token, k) slots
recompute pull x rows again | FC1 by the same tile engine (bit-identical h) on the rows past
          the h forward kept (kernel.kept_h_tokens): for the separate backward, which makes
          act itself; the backward megakernel recomputes inside its launch
backward  csrc/megakernel/moe_backward.cu: pull dY rows (and x, recomputing) | FC1 again
          (recomputing) | FC2-dgrad + act backward | dW2 | FC1-dgrad, dX rows and dprobs
          pushed to the source slots | dW1; recomputing, macrobatch by macrobatch through a
          ring, so its buffers do not grow with the routing; under mxfp8 and fp8_blockwise it
          also rounds dY, x, act and dh (operands.py's table) once each, inside the launch

symm_moe.py runs the publish, barriers and fixed-order reductions around these calls.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import ops, separate_path
from .plan import ExpertInputs, Plan, Schedule, h_past_kept
from .separate_path import pull


def forward(plan: Plan, sched: Schedule, keep: bool, kept_h_rows: int = 0) -> ExpertInputs:
    """`keep`: the rows, h and act for backward (saved backward inputs), else only transient
    buffers - a ring of macrobatches with the ring on (plan.ring_mblocks) - and h of the
    schedule's first `kept_h_rows` rows (then the one thing returned)."""
    ws = plan.ws
    cap, device = sched.capacity, sched.row_slot.device
    n = ops.macrobatch_ring_rows(cap, plan.num_local, plan.ring_mblocks)
    buffers = plan.operands.megakernel_rows(n, ws.layout.hidden, plan.ffn, device)
    h_rows = cap if keep else kept_h_rows
    h = (torch.empty(h_rows, plan.w1.shape[1], dtype=torch.bfloat16, device=device)
         if h_rows else None)
    counters = ops.megakernel_counters(cap, plan.num_local, device, plan.ring_mblocks)
    ops.moe_forward_megakernel(ws.peer_bases, ws.offsets["tokens"], ws.offsets["slots"],
                               sched.offsets, sched.row_slot, sched.row_prob,
                               ws.layout.max_tokens, plan.topk,
                               activation=plan.activation, h_out=h,
                               counters=counters, comm_blocks=plan.comm_blocks_forward,
                               timeout_ns=ws.timeout_ns, minibatch_rows=plan.minibatch_rows,
                               ring_mblocks=plan.ring_mblocks, rank=ws.rank,
                               wire=ws.layout.fp8_rows, **buffers,
                               **plan.operands.megakernel_weights(plan))
    if not keep:
        return ExpertInputs(None, h, None)
    return ExpertInputs(buffers["rows"], h, buffers["act"])


def recompute(plan: Plan, sched: Schedule, head: Optional[torch.Tensor] = None
              ) -> ExpertInputs:
    """The rows and h forward had, bit for bit: the megakernel's FC1 tiles are the tile
    engine's, so the standalone engine reproduces them - as a plain product (h rounded to bf16
    as the activation's epilogue rounds it; no act, which the separate backward makes itself)
    past `head`, the h of the first rows forward kept (then h is a SplitH). Under a quantized
    recipe (forward dispatched FP8 wire rows) the separate path's FC1 is that engine on the
    same operands already (operands.py)."""
    if plan.ws.layout.fp8_rows is not None:
        return separate_path.recompute(plan, sched, head)
    ws = plan.ws
    rows = pull(plan, "inputs", sched)

    def fc1_past(past: Schedule, first: int) -> torch.Tensor:
        h = torch.empty(past.capacity, plan.w1.shape[1], dtype=torch.bfloat16,
                        device=rows.device)
        ops.grouped_gemm(rows[first:], plan.w1, past.offsets, h, timeout_ns=ws.timeout_ns,
                         rank=ws.rank)
        return h

    return ExpertInputs(rows, h_past_kept(sched, head, fc1_past), None)


def backward(plan: Plan, sched: Schedule, kept: Optional[ExpertInputs]):
    """dX rows and dprobs pushed to the source slots in one launch; returns the stacked bf16
    dW1, dW2, or (None, None) where the weight gradients were added into Megatron's fp32
    main_grads (plan.main_grads). `kept`: forward's rows, h and act (saved backward inputs),
    or None: the launch recomputes them through the ring (plan.ring_mblocks), pulling the x
    rows published in the workspace's inputs."""
    ws = plan.ws
    cap, device = sched.capacity, sched.row_slot.device
    hidden, f1, ffn = ws.layout.hidden, plan.w1.shape[1], plan.ffn
    ring_mblocks = plan.ring_mblocks if kept is None else 0
    n = ops.macrobatch_ring_rows(cap, plan.num_local, ring_mblocks)

    def rows_buffer(width):
        return torch.empty(n, width, dtype=torch.bfloat16, device=device)

    if kept is None:
        kept = ExpertInputs(rows_buffer(hidden), rows_buffer(f1), rows_buffer(ffn))
    dout, dh = rows_buffer(hidden), rows_buffer(f1)
    recipe = plan.operands.backward_megakernel_operands(plan, n)
    dprob_part = torch.empty(ops.dprob_part_size(n, ffn), dtype=torch.float32, device=device)
    if plan.main_grads is None:
        dw1 = torch.empty(plan.w1.shape, dtype=torch.bfloat16, device=device)
        dw2 = torch.empty(plan.w2.shape, dtype=torch.bfloat16, device=device)
        into = dict(dw1=dw1, dw2=dw2)
    else:
        dw1 = dw2 = None
        into = dict(dw1_fp32=plan.main_grads.dw1, dw2_fp32=plan.main_grads.dw2)
    wgrad_tiles = ops.backward_wgrad_tiles(hidden, ffn, f1)
    counters = ops.backward_megakernel_counters(cap, plan.num_local, device, ring_mblocks,
                                                wgrad_tiles,
                                                rounding_tiles=plan.operands.rounds_both)
    carry = ops.backward_carry(cap, plan.num_local, ring_mblocks, wgrad_tiles, device)
    ops.moe_backward_megakernel(ws.peer_bases, ws.offsets["tokens"],
                                ws.offsets["inputs"], ws.offsets["slots"],
                                ws.offsets["slot_values"], sched.offsets, sched.row_slot,
                                sched.row_prob, ws.layout.max_tokens, plan.topk,
                                plan.activation, kept.rows, kept.h, kept.act, dout, dh,
                                dprob_part, counters, plan.comm_blocks_backward,
                                ws.timeout_ns, **recipe, **into, carry=carry,
                                minibatch_rows=plan.minibatch_rows, ring_mblocks=ring_mblocks,
                                rank=ws.rank)
    return dw1, dw2
