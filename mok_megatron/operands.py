"""What the separate path's GEMMs multiply, per recipe precision.

bf16: the operands as they are. mxfp8: every operand rounded to MXFP8 along the reduction
dimension of the GEMM that reads it, as the reference's expert MLP does (mxfp8.py, the table
before ``_qmm``), by csrc/quant/mx_round.cu, and handed to the same BF16 grouped GEMMs
dequantized: exact in bf16, so they multiply MXFP8's values with fp32 accumulation.

    forward   h   = Q_H(rows) Q_H(W1)^T          out = Q_F(act) Q_F(W2)^T
    dgrad     dA  = Q_H(dY) Q_H(W2)               dX  = Q_F1(dh) Q_F1(W1)
    wgrad     dW2 = Q_n(dY)^T Q_n(act)            dW1 = Q_n(dh)^T Q_n(rows)

Q along H, F, F1 ("columns") cuts each row; Q_n cuts each expert's rows from its first row
(the schedule's offsets); a weight in its other orientation is cut per expert the same way.
The weights are rounded at every call (no cache across micro-batches yet), and the rounded
copies are transient: what forward keeps for backward stays BF16.
"""

from __future__ import annotations

import torch

from . import ops


class Bf16Operands:
    """The BF16 recipe: every operand as it is."""

    def columns(self, x: torch.Tensor, sched) -> torch.Tensor:
        """Scheduled rows [cap, C], blocks along C (H, F or F1)."""
        return x

    def expert_rows(self, x: torch.Tensor, sched) -> torch.Tensor:
        """Scheduled rows [cap, C], blocks along each expert's rows (a wgrad's K)."""
        return x

    def weight_columns(self, w: torch.Tensor) -> torch.Tensor:
        """Stacked weights [E, r, c], blocks along c."""
        return w

    def weight_rows(self, w: torch.Tensor) -> torch.Tensor:
        """Stacked weights [E, r, c], blocks along each expert's r."""
        return w


class Mxfp8Operands(Bf16Operands):
    def columns(self, x, sched):
        return ops.mx_round_columns(x, sched.num_rows)

    def expert_rows(self, x, sched):
        return ops.mx_round_segments(x, sched.offsets)

    def weight_columns(self, w):
        E, r, c = w.shape
        return ops.mx_round_columns(w.contiguous().view(E * r, c)).view(E, r, c)

    def weight_rows(self, w):
        E, r, c = w.shape
        return ops.mx_round_segments(w.contiguous().view(E * r, c), segment_rows=r).view(E, r, c)


OPERANDS = {"bf16": Bf16Operands(), "mxfp8": Mxfp8Operands()}
