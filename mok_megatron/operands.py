"""The separate path's GEMMs per recipe precision: what each one multiplies and which kernel
runs it.

bf16: the operands as they are, through torch._grouped_mm (and the activation kernel after
FC1). mxfp8: every operand rounded to MXFP8 along the reduction dimension of the GEMM that
reads it, as the reference's expert MLP does (mxfp8.py, the table before ``_qmm``):

    forward   h   = Q_H(rows) Q_H(W1)^T          out = Q_F(act) Q_F(W2)^T
    dgrad     dA  = Q_H(dY) Q_H(W2)               dX  = Q_F1(dh) Q_F1(W1)
    wgrad     dW2 = Q_n(dY)^T Q_n(act)            dW1 = Q_n(dh)^T Q_n(rows)

Q along H, F, F1 ("columns") cuts each row; Q_n cuts each expert's rows from its first row
(the schedule's offsets). Forward and dgrad run on the FP8 grouped GEMM
(csrc/gemm/fp8_grouped_gemm.cu: E4M3 tensor-core MMAs, fp32 promotion per 32 of K with row x
column scales) with the weights as MXFP8 codes (one byte each, quantized once per optimizer
step: mxfp8_weights.py) and the activation operand quantized per call to codes by
csrc/quant/mx_round.cu; FC1's activation is the engine's epilogue. Wgrad rounds both operands
along the expert's rows and runs torch._grouped_mm. What forward keeps for backward stays
BF16.

fp8_blockwise: the same table with 1 x 128 blocks along each row for the activation operands,
128 x 128 blocks for the weights (fp8_block_weights.py) and 128 x 1 blocks along the expert's
rows for wgrad (fp8_blockwise.py); forward and dgrad run on the FP8 grouped GEMM
(csrc/gemm/fp8_grouped_gemm.cu: E4M3 tensor-core MMAs, fp32 promotion per 128 of K), the
activation operand quantized per call to codes.
"""

from __future__ import annotations

import abc

from typing import TYPE_CHECKING

import torch

from . import ops

if TYPE_CHECKING:
    from .mxfp8_weights import Mxfp8Weights
    from .plan import Plan, Schedule


def _grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offs)


def _rows(sched: "Schedule", cols: int, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(sched.capacity, cols, dtype=torch.bfloat16, device=like.device)


class Bf16Operands:
    """The BF16 recipe: every operand as it is."""

    def fc1(self, plan: "Plan", sched: "Schedule", rows: torch.Tensor):
        """-> (h [cap, F1], act = act(h) * p [cap, F])."""
        h = _grouped(rows, plan.w1.transpose(1, 2), sched.offs)
        act = _rows(sched, plan.ffn, rows)
        ops.activation_forward(h, sched.row_prob, sched.num_rows, plan.activation, act)
        return h, act

    def fc2(self, plan, sched, act):
        return _grouped(act, plan.w2.transpose(1, 2), sched.offs)

    def fc2_dgrad(self, plan, sched, dout):
        """dA = dY W2 [cap, F]."""
        return _grouped(dout, plan.w2, sched.offs)

    def fc1_dgrad(self, plan, sched, dh):
        """dX rows = dh W1 [cap, H]."""
        return _grouped(dh, plan.w1, sched.offs)

    def wgrad(self, sched, dout, act, dh, rows):
        """-> (dW1, dW2), stacked."""
        dw2 = _grouped(dout.t(), act, sched.offs)
        dw1 = _grouped(dh.t(), rows, sched.offs)
        return dw1, dw2


class _QuantizedOperands(Bf16Operands, abc.ABC):
    """Forward and dgrad on one of our engines with the weights quantized once per optimizer
    step (``weights``: both orientations) and the activation operand quantized per call by
    ``_engine``; wgrad rounds both operands along the expert's rows in blocks of
    ``segment_block`` and runs torch._grouped_mm on the (exact in bf16) values."""

    segment_block: int

    def __init__(self, weights):
        self.weights = weights

    @abc.abstractmethod
    def _engine(self, plan, sched, a, w, out, **epilogue):
        """out = epilogue(Q(a) w^T) on the recipe's engine, a quantized per call."""

    def fc1(self, plan, sched, rows):
        h = _rows(sched, plan.w1.shape[1], rows)
        act = self._engine(plan, sched, rows, self.weights.w1, _rows(sched, plan.ffn, rows),
                           activation=plan.activation, row_prob=sched.row_prob, h_out=h)
        return h, act

    def fc2(self, plan, sched, act):
        return self._engine(plan, sched, act, self.weights.w2, _rows(sched, plan.w2.shape[1], act))

    def fc2_dgrad(self, plan, sched, dout):
        return self._engine(plan, sched, dout, self.weights.w2_t, _rows(sched, plan.ffn, dout))

    def fc1_dgrad(self, plan, sched, dh):
        return self._engine(plan, sched, dh, self.weights.w1_t,
                            _rows(sched, plan.w1.shape[2], dh))

    def wgrad(self, sched, dout, act, dh, rows):
        return super().wgrad(sched, *(ops.mx_round_segments(x, sched.offsets,
                                                            block=self.segment_block)
                                      for x in (dout, act, dh, rows)))


class Mxfp8Operands(_QuantizedOperands):
    """The FP8 engine on MXFP8 codes: the activation operand per 1 x 32 of each row, the
    weights per 32 x 1 of each weight row (mxfp8_weights.py)."""

    segment_block = ops.MX_BLOCK

    def _engine(self, plan, sched, a, w, out, **epilogue):
        codes, scales = ops.fp8_quantize_rows(a, sched.num_rows, block=ops.MX_BLOCK)
        ops.fp8_grouped_gemm(codes, scales, w.codes, w.column_scales, sched.offsets, out,
                             scale_block=ops.MX_BLOCK, timeout_ns=plan.ws.timeout_ns,
                             rank=plan.ws.rank, **epilogue)
        return out


class Fp8BlockwiseOperands(_QuantizedOperands):
    """The blockwise FP8 engine: the activation operand as E4M3 codes per 1 x 128 of each row,
    the weights per 128 x 128 block (fp8_block_weights.py)."""

    segment_block = ops.FP8_BLOCK

    def _engine(self, plan, sched, a, w, out, **epilogue):
        codes, scales = ops.fp8_quantize_rows(a, sched.num_rows)
        ops.fp8_grouped_gemm(codes, scales, w.codes, w.scales, sched.offsets, out,
                             timeout_ns=plan.ws.timeout_ns, rank=plan.ws.rank, **epilogue)
        return out
