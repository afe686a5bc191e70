"""The separate-kernel path (v1): the expert stage of a MoE call as one kernel per step, kept
as the baseline the megakernels are measured against and checked bit for bit with.

forward   pull x rows from their source ranks (FP8 rows under an FP8 recipe with recomputed
          backward inputs) | FC1 | act * p | FC2
          push result rows to their (source rank, token, k) slots
recompute pull x rows again (from the peers' republished inputs) | h as forward's FC1 made it,
          on the rows past the h forward kept (kernel.kept_h_tokens)
backward  pull dY rows | dA = dY W2 | act backward (dh, act, dp)
          dX rows = dh W1, pushed with dp to the source slots | dW2, dW1

Under an FP8 recipe backward's pulls (x again, dY) write each row in both of the recipe's
forms, along K for FC1 or the dgrad and along the expert's rows for wgrad, and dh gets both in
one pass (operands.RoundedBoth).

No host synchronization: the grouped GEMMs take device-side offsets and the row movers and
epilogues read the row count from device memory. The GEMMs are plan.operands' (operands.py):
torch._grouped_mm on the operands as they are (bf16), or MXFP8's operands on the tile engine
and torch._grouped_mm (mxfp8). symm_moe.py runs the publish, barriers and fixed-order
reductions around these steps.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import ops
from .operands import for_wgrad
from .plan import ExpertInputs, Plan, Schedule, SplitH, h_past_kept, rows_past


def pull(plan: Plan, region: str, sched: Schedule) -> torch.Tensor:
    """This rank's schedule rows, pulled from `region` ([max_tokens, H] per rank) of every
    rank's workspace; rows past the schedule's end are left unwritten."""
    ws = plan.ws
    rows = torch.empty(sched.capacity, ws.layout.hidden, dtype=torch.bfloat16,
                       device=sched.row_slot.device)
    ops.pull_rows(ws.peer_bases, ws.offsets[region], sched.row_slot, sched.num_rows,
                  ws.layout.max_tokens, plan.topk, rows)
    return rows


def pull_operand(plan: Plan, region: str, sched: Schedule):
    """Backward's rows from `region` as the recipe's GEMMs read them: bf16 rows, or under an
    FP8 recipe both of its forms at once (operands.RoundedBoth; the rows never land as bf16)."""
    if not plan.operands.rounds_both:
        return pull(plan, region, sched)
    ws = plan.ws
    return plan.operands.pulled_both_ways(sched, ws.peer_bases, ws.offsets[region],
                                          ws.layout.max_tokens, plan.topk, ws.layout.hidden)


def forward(plan: Plan, sched: Schedule, keep_h: bool = True) -> ExpertInputs:
    """What forward keeps: the rows (None when they came as FP8 rows), h (None where not
    keep_h and the recipe's FC1 epilogue makes act without it) and act."""
    ws = plan.ws
    fp8_rows = ws.layout.fp8_rows
    pull_from = (ws.peer_bases, ws.offsets["tokens"], sched.row_slot, sched.num_rows,
                 ws.layout.max_tokens, plan.topk, fp8_rows)
    if fp8_rows is None:
        rows = pull(plan, "tokens", sched)
        kept = ExpertInputs(rows, *plan.operands.fc1(plan, sched, rows, keep_h))
    else:  # codes, or the wire's values as bf16 rows (exact) for an FC1 multiplying bf16
        pull_fp8 = (ops.pull_fp8_rows if plan.operands.fc1_reads_codes
                    else ops.pull_fp8_rows_dequantized)
        kept = ExpertInputs(None, *plan.operands.fc1_prepared(plan, sched, pull_fp8(*pull_from),
                                                              keep_h))
    out_rows = plan.operands.fc2(plan, sched, kept.act)
    ops.push_rows(ws.peer_bases, ws.offsets["slots"], sched.row_slot, sched.num_rows,
                  ws.layout.max_tokens * plan.topk, out_rows)
    return kept


def recompute(plan: Plan, sched: Schedule, head: Optional[torch.Tensor] = None
              ) -> ExpertInputs:
    """The rows (as wgrad reads them) and h forward had, bit for bit: the token rows pulled
    again from the peers' republished inputs and FC1 again (operands' fc1_past) - past `head`, the
    h of the first rows that forward kept (then h is a SplitH). act is left to the separate
    backward, which makes it in the activation's backward."""
    rows = pull_operand(plan, "inputs", sched)
    h = h_past_kept(sched, head,
                    lambda past, first: plan.operands.fc1_past(plan, past, rows, first))
    return ExpertInputs(for_wgrad(rows), h, None)


def _activation_backward(plan: Plan, sched: Schedule, h, dact: torch.Tensor):
    """(dh, act, drow_prob) of every schedule row; a SplitH's two row ranges each in place
    in the full outputs (the rows are independent: the bits of one launch over h whole)."""
    f1 = plan.w1.shape[1]
    dh = torch.empty(sched.capacity, f1, dtype=torch.bfloat16, device=dact.device)
    act = torch.empty_like(dact)
    drow_prob = torch.empty(sched.capacity, dtype=torch.float32, device=dact.device)
    if not isinstance(h, SplitH):
        ops.activation_backward(h, dact, sched.row_prob, sched.num_rows, plan.activation, dh,
                                act, drow_prob)
        return dh, act, drow_prob
    n = h.head.shape[0]
    past = rows_past(sched, n)
    for part, rows, num_rows, row_prob in ((h.head, slice(0, n), sched.num_rows.clamp(max=n),
                                            sched.row_prob[:n]),
                                           (h.tail, slice(n, None), past.num_rows,
                                            past.row_prob)):
        ops.activation_backward(part, dact[rows], row_prob, num_rows, plan.activation,
                                dh[rows], act[rows], drow_prob[rows])
    return dh, act, drow_prob


def backward(plan: Plan, sched: Schedule, kept: ExpertInputs):
    """dX rows and dprobs pushed to the source slots; returns the stacked dW1, dW2."""
    ws, q = plan.ws, plan.operands
    slots_per_rank = ws.layout.max_tokens * plan.topk
    dout = pull_operand(plan, "tokens", sched)
    dact = q.fc2_dgrad(plan, sched, dout)
    dout = for_wgrad(dout)
    dh, act, drow_prob = _activation_backward(plan, sched, kept.h, dact)
    dh = q.both_ways(sched, dh)
    drows = q.fc1_dgrad(plan, sched, dh)
    dh = for_wgrad(dh)
    ops.push_rows(ws.peer_bases, ws.offsets["slots"], sched.row_slot, sched.num_rows,
                  slots_per_rank, drows)
    ops.push_values(ws.peer_bases, ws.offsets["slot_values"], sched.row_slot, sched.num_rows,
                    slots_per_rank, drow_prob)
    # Weight gradients while the peers finish their pushes.
    return q.wgrad(plan, sched, dout, act, dh, kept.rows)
