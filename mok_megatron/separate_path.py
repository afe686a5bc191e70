"""The separate-kernel path (v1): the expert stage of a MoE call as one kernel per step, kept
as the baseline the megakernels are measured against and checked bit for bit with.

forward   pull x rows from their source ranks | FC1 (torch._grouped_mm) | act * p | FC2
          push result rows to their (source rank, token, k) slots
recompute pull x rows again (from the peers' republished inputs) | FC1, as forward did it
backward  pull dY rows | dA = dY W2 | act backward (dh, act, dp)
          dX rows = dh W1, pushed with dp to the source slots | dW2, dW1

No host synchronization: the grouped GEMMs take device-side offsets and the row movers and
epilogues read the row count from device memory. Every GEMM reads its operands through
plan.operands: as they are (bf16) or rounded to MXFP8 along its reduction dimension (mxfp8,
operands.py). symm_moe.py runs the publish, barriers and
fixed-order reductions around these steps.
"""

from __future__ import annotations

import torch

from . import ops
from .plan import ExpertInputs, Plan, Schedule


def _grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offs)


def pull(plan: Plan, region: str, sched: Schedule) -> torch.Tensor:
    """This rank's schedule rows, pulled from `region` ([max_tokens, H] per rank) of every
    rank's workspace; rows past the schedule's end are left unwritten."""
    ws = plan.ws
    rows = torch.empty(sched.capacity, ws.layout.hidden, dtype=torch.bfloat16,
                       device=sched.row_slot.device)
    ops.pull_rows(ws.peer_bases, ws.offsets[region], sched.row_slot, sched.num_rows,
                  ws.layout.max_tokens, plan.topk, rows)
    return rows


def _pull_and_fc1(plan: Plan, sched: Schedule, region: str) -> ExpertInputs:
    """Rows pulled from `region`, h = FC1 of them and act = act(h) * p."""
    q = plan.operands
    rows = pull(plan, region, sched)
    h = _grouped(q.columns(rows, sched), q.weight_columns(plan.w1).transpose(1, 2), sched.offs)
    act = torch.empty(sched.capacity, plan.ffn, dtype=torch.bfloat16, device=rows.device)
    ops.activation_forward(h, sched.row_prob, sched.num_rows, plan.activation, act)
    return ExpertInputs(rows, h, act)


def forward(plan: Plan, sched: Schedule) -> ExpertInputs:
    ws = plan.ws
    q = plan.operands
    kept = _pull_and_fc1(plan, sched, "tokens")
    out_rows = _grouped(q.columns(kept.act, sched), q.weight_columns(plan.w2).transpose(1, 2),
                        sched.offs)
    ops.push_rows(ws.peer_bases, ws.offsets["slots"], sched.row_slot, sched.num_rows,
                  ws.layout.max_tokens * plan.topk, out_rows)
    return kept


def recompute(plan: Plan, sched: Schedule) -> ExpertInputs:
    """The rows, h and act forward had, bit for bit: the token rows pulled again from the
    peers' republished inputs and FC1 by the same kernels."""
    return _pull_and_fc1(plan, sched, "inputs")


def backward(plan: Plan, sched: Schedule, kept: ExpertInputs):
    """dX rows and dprobs pushed to the source slots; returns the stacked dW1, dW2."""
    ws, q = plan.ws, plan.operands
    slots_per_rank = ws.layout.max_tokens * plan.topk
    dout = pull(plan, "tokens", sched)
    dact = _grouped(q.columns(dout, sched), q.weight_rows(plan.w2), sched.offs)
    dh = torch.empty_like(kept.h)
    act = torch.empty_like(dact)
    drow_prob = torch.empty(sched.capacity, dtype=torch.float32, device=dout.device)
    ops.activation_backward(kept.h, dact, sched.row_prob, sched.num_rows, plan.activation, dh,
                            act, drow_prob)
    drows = _grouped(q.columns(dh, sched), q.weight_rows(plan.w1), sched.offs)
    ops.push_rows(ws.peer_bases, ws.offsets["slots"], sched.row_slot, sched.num_rows,
                  slots_per_rank, drows)
    ops.push_values(ws.peer_bases, ws.offsets["slot_values"], sched.row_slot, sched.num_rows,
                    slots_per_rank, drow_prob)
    # Weight gradients while the peers finish their pushes.
    dw2 = _grouped(q.expert_rows(dout, sched).t(), q.expert_rows(act, sched), sched.offs)
    dw1 = _grouped(q.expert_rows(dh, sched).t(), q.expert_rows(kept.rows, sched), sched.offs)
    return dw1, dw2
