"""What a checked MoE call becomes before any kernel runs (symm_moe.py builds it once per
call), and what the expert-stage paths (separate_path.py, megakernel_path.py) hand back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

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


@dataclass
class ExpertInputs:
    """What backward starts from, at schedule positions: token rows [cap, H], FC1 output h
    [cap, F1] and act(h) * p [cap, F] (None where forward kept nothing). Recomputed under
    an FP8 recipe the rows are only what wgrad reads (operands.RoundedBoth)."""

    rows: Optional[Union[torch.Tensor, RoundedBoth]]
    h: Optional[torch.Tensor]
    act: Optional[torch.Tensor]
