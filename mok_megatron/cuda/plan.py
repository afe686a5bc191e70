"""What a checked MoE call becomes before any kernel runs (symm_moe.py builds it once per
call), and what the expert-stage paths (separate_path.py, megakernel_path.py) hand back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch

from .main_grad import MainGradTargets
from .operands import Bf16Operands, RoundedBoth
from .workspace import Workspace


@dataclass
class Plan:
    ws: Workspace
    activation: str
    topk: int
    num_local: int
    ffn: int
    w1: torch.Tensor  # [E_local, F1, H] stacked view, row j = expert order[j]
    w2: torch.Tensor  # [E_local, H, F]
    order: Optional[list]  # None: the weights came as stacked tensors (identity order)
    position: torch.Tensor  # int32 [E_local] on the device: expert -> its row in the views
    forward_megakernel: bool  # recipe kernel.forward_kernel
    backward_megakernel: bool  # recipe kernel.backward_kernel
    comm_blocks_forward: int  # blocks of the forward megakernel that pull rows
    comm_blocks_backward: int  # blocks of the backward megakernel that pull dY rows
    recompute: bool  # backward pulls the rows again and recomputes h (kernel.backward_inputs)
    ring_mblocks: int  # m-blocks per macrobatch of the megakernels' rings; 0: no ring
    minibatch_rows: int  # megakernels: rows their pull publishes together
    schedule_capacity: float  # rows of the schedule and forward buffers, of the worst case
    # recomputing: the schedule's first rows whose h forward keeps (kernel.kept_h_tokens in
    # whole m-blocks; kept_h_rows caps it at a call's schedule)
    kept_h_tokens: int
    # Megatron's main_grads the backward adds the weight gradients into, or None:
    # bf16 gradients through autograd (main_grad.py)
    main_grads: Optional[MainGradTargets] = None
    # The separate path's GEMMs under the recipe's precision (operands.py)
    operands: Bf16Operands = field(default_factory=Bf16Operands)


@dataclass
class Schedule:
    """This rank's rows, in (expert position, source rank, token, k) order, on the device."""

    offsets: torch.Tensor  # int32 [E + 1] expert row ranges
    row_slot: torch.Tensor  # int32 [capacity] flat (source, token, k) of each row
    row_prob: torch.Tensor  # fp32 [capacity] router prob of each row

    @property
    def capacity(self) -> int:
        return self.row_slot.numel()

    @property
    def num_rows(self) -> torch.Tensor:
        return self.offsets[-1:]

    @property
    def offs(self) -> torch.Tensor:
        """Cumulative row ends, as torch._grouped_mm takes them."""
        return self.offsets[1:]


@dataclass(frozen=True)
class SplitH:
    """FC1's output h of a schedule in two row ranges (backward recomputing with
    kernel.kept_h_tokens): forward's kept first rows and those recomputed past them."""

    head: torch.Tensor  # [n, F1], rows 0 .. n - 1
    tail: torch.Tensor  # [cap - n, F1], rows n .. cap - 1


@dataclass
class ExpertInputs:
    """What backward starts from, at schedule positions: token rows [cap, H], FC1 output h
    [cap, F1] (or SplitH) and act(h) * p [cap, F] (None where forward kept nothing, or
    where the separate backward makes it itself). Recomputed under an FP8 recipe the rows
    are only what wgrad reads (operands.RoundedBoth)."""

    rows: Optional[Union[torch.Tensor, RoundedBoth]]
    h: Optional[Union[torch.Tensor, SplitH]]
    act: Optional[torch.Tensor]


def kept_h_rows(plan: Plan, sched: Schedule) -> int:
    """Rows of h forward keeps for backward (recomputing): plan.kept_h_tokens, at most the
    schedule's."""
    return min(plan.kept_h_tokens, sched.capacity)


def h_past_kept(sched: Schedule, head: Optional[torch.Tensor],
                fc1_past: Callable[[Schedule, int], torch.Tensor]
                ) -> Union[torch.Tensor, SplitH]:
    """h of every schedule row when backward recomputes: forward's kept `head` (its first
    rows, or None) and fc1_past(schedule of the rows past it, its first row) for the rest -
    one tensor where either part is empty, else a SplitH."""
    n = 0 if head is None else head.shape[0]
    if n == 0:
        return fc1_past(sched, 0)
    if n >= sched.capacity:
        return head
    return SplitH(head, fc1_past(rows_past(sched, n), n))


def rows_past(sched: Schedule, first: int) -> Schedule:
    """The schedule's rows from `first` on as a schedule of their own: views of its rows and
    its offsets moved down on the device (no host sync); an expert's rows before `first`
    leave it, experts wholly before it have none."""
    return Schedule((sched.offsets - first).clamp_(min=0), sched.row_slot[first:],
                    sched.row_prob[first:])
