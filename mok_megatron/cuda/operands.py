"""The separate path's GEMMs per recipe precision: what each one multiplies and which kernel
runs it.

bf16: the operands as they are, through torch._grouped_mm (and the activation kernel after
FC1). mxfp8: every operand rounded to MXFP8 along the reduction dimension of the GEMM that
reads it, as the reference's expert MLP does (mxfp8.py, the table before ``_qmm``):

    forward   h   = Q_H(rows) Q_H(W1)^T          out = Q_F(act) Q_F(W2)^T
    dgrad     dA  = Q_H(dY) Q_H(W2)               dX  = Q_F1(dh) Q_F1(W1)
    wgrad     dW2 = Q_n(dY)^T Q_n(act)            dW1 = Q_n(dh)^T Q_n(rows)

Q along H, F, F1 ("columns") cuts each row; Q_n cuts each expert's rows from its first row
(the schedule's offsets). The activation operand is bf16 rows holding MXFP8 values: FC1's rows
as the FP8 wire's pull delivers them when forward dispatches FP8 rows
(symm_moe.fp8_wire_row; the forward megakernel's pull dequantizes them the same way), every other activation operand rounded per call by
csrc/quant/mx_round.cu. The weights are quantized once per optimizer step in both
orientations (mxfp8_weights.py) and kept in one of two forms (kernel.mxfp8_weights):
- codes (one byte each): forward and dgrad on the tile engine that dequantizes them to bf16
  in shared memory per tile (csrc/gemm/sm90/mx_weight_stage.cuh), FC1's activation its
  epilogue. It beat the FP8 engine (E4M3 MMAs promoted per 32 of K with row x column scales)
  on every GEMM of the recipe, 0.62-0.81x its time (docs/perf-log.md, MXFP8, 2026-12-03/04), so that variant
  was removed;
- rounded (their bf16 values, two bytes each): the same tile engine multiplying them as
  plain bf16 weights, no per-tile conversion - faster where a weight tile is reused by many
  rows (auto picks by the call's rows per local expert, config.MXFP8_ROUNDED_MIN_ROWS).
Wgrad rounds both operands along the expert's rows and runs torch._grouped_mm (or, into
Megatron's fp32 main_grads, ops.grouped_wgrad_accumulate). What forward
keeps for backward stays BF16.

fp8_blockwise: the same table with 1 x 128 blocks along each row for the activation operands,
128 x 128 blocks for the weights (fp8_block_weights.py) and 128 x 1 blocks along the expert's
rows for wgrad (fp8_blockwise.py); forward and dgrad run on the FP8 grouped GEMM
(csrc/gemm/fp8_grouped_gemm.cu: E4M3 tensor-core MMAs, fp32 promotion per 128 of K), FC1's
rows dispatched as FP8 codes as under mxfp8 and pulled as codes, the other activation
operands quantized per call; wgrad as under mxfp8 (the operands rounded to their blocks,
torch._grouped_mm): an FP8 wgrad kernel on operands quantized and written transposed took
1.37-1.56x its time on every layer shape (docs/perf-log.md, Blockwise FP8, 2026-12-03).

Forward's rows kept for backward (saved backward inputs) are kept under both FP8 recipes as
wgrad reads them, codes along the expert's rows (SegmentCodes), not as bf16 rows.

Under both FP8 recipes backward's operands that two GEMMs read - dY, dh and the recomputed
rows, along K by a dgrad or FC1 and along the expert's rows by wgrad - get both forms from one
pass (RoundedBoth: dY and the rows as they are pulled, dh after the activation's backward),
so none is read once per form. Only act (wgrad alone) and forward's saved rows are rounded
along the rows by themselves. The backward megakernel under mxfp8 multiplies the same
operands: its rounding tiles run the both-forms pass's arithmetic inside the launch
(csrc/megakernel/mx_round_tile.cuh).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from . import ops
from .mxfp8_weights import MxWeight

# The methods' Plan and Schedule are plan.py's, named in annotations only: plan.py imports this
# module (a plan holds its operands), never the other way round.


@dataclass(frozen=True)
class RoundedBoth:
    """A backward operand in both of its recipe's forms from one pass (ops.mx_round_both,
    ops.fp8_quantize_round_both and their pulls): along each row as its dgrad or FC1 reads it
    (MXFP8: bf16 values; blockwise: codes and scale codes; None once that reader has run:
    ``for_wgrad``), and along each expert's rows as wgrad reads it (bf16 values)."""

    along_k: Optional[Union[torch.Tensor, tuple]]
    along_n: torch.Tensor


@dataclass(frozen=True)
class SegmentCodes:
    """Forward's pulled rows kept for backward (saved backward inputs) under an FP8 recipe as
    what wgrad reads of them: their blocks along each expert's rows as E4M3 codes and E8M0
    scale codes (ops.mx_quantize_segments), dequantized when wgrad runs - the values
    mx_round_segments would give, in about half the bytes kept between forward and backward."""

    codes: torch.Tensor
    scales: torch.Tensor


def for_wgrad(operand):
    """What wgrad still needs of a backward operand once its other reader has run (the copy
    rounded along K of a RoundedBoth is released)."""
    return RoundedBoth(None, operand.along_n) if isinstance(operand, RoundedBoth) else operand


def _grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offs)


def _rows(sched: Schedule, cols: int) -> torch.Tensor:
    return _buffer(sched.capacity, cols, sched.row_slot.device)


def _buffer(n: int, cols: int, device) -> torch.Tensor:
    return torch.empty(n, cols, dtype=torch.bfloat16, device=device)


class Bf16Operands:
    """The BF16 recipe: every operand as it is."""

    # Whether backward's operands come in both forms from one pass (RoundedBoth): dh from
    # both_ways, the pulled rows from pulled_both_ways (separate_path.pull_operand).
    rounds_both = False

    def both_ways(self, sched: Schedule, x: torch.Tensor):
        """A backward operand (dh) as its dgrad and wgrad read it."""
        return x

    def keep_rows(self, sched: Schedule, rows: torch.Tensor):
        """What forward keeps of its pulled rows for backward's wgrad (saved backward inputs,
        the separate backward): the rows themselves."""
        return rows

    def megakernel_weights(self, plan: Plan) -> dict:
        """The forward megakernel's weight arguments (ops.moe_forward_megakernel)."""
        return dict(w1=plan.w1, w2=plan.w2)

    def megakernel_rows(self, n: int, hidden: int, ffn: int, device) -> dict:
        """The forward megakernel's row buffers of n rows: the pulled rows and act as its
        GEMMs read them (bf16 rows)."""
        return dict(rows=_buffer(n, hidden, device), act=_buffer(n, ffn, device))

    def backward_megakernel_operands(self, plan: Plan, n: int) -> dict:
        """The backward megakernel's recipe arguments (ops.moe_backward_megakernel: the
        weights, and under an FP8 recipe what its GEMMs read beyond the BF16 launch's, with
        the launch's buffers of n rows of the forms along K)."""
        return dict(w1=plan.w1, w2=plan.w2)

    def fc1(self, plan: Plan, sched: Schedule, rows: torch.Tensor, keep_h: bool = True):
        """-> (h [cap, F1], act = act(h) * p [cap, F]); h None where not keep_h and the
        recipe's engine makes act without writing h (here it is act's input anyway)."""
        h = _grouped(rows, plan.w1.transpose(1, 2), sched.offs)
        act = _rows(sched, plan.ffn)
        ops.activation_forward(h, sched.row_prob, sched.num_rows, plan.activation, act)
        return h, act

    def fc1_past(self, plan, past: Schedule, rows, first: int) -> torch.Tensor:
        """h [cap - first, F1] of the rows from `first` on, as fc1 makes them (backward
        recomputing past the h forward kept; first = 0: every row): `past` is the schedule of
        those rows (plan.py: rows_past). No act: the separate backward makes it itself."""
        return _grouped(rows[first:], plan.w1.transpose(1, 2), past.offs)

    def fc2(self, plan, sched, act):
        return _grouped(act, plan.w2.transpose(1, 2), sched.offs)

    def fc2_dgrad(self, plan, sched, dout):
        """dA = dY W2 [cap, F]."""
        return _grouped(dout, plan.w2, sched.offs)

    def fc1_dgrad(self, plan, sched, dh):
        """dX rows = dh W1 [cap, H]."""
        return _grouped(dh, plan.w1, sched.offs)

    def wgrad(self, plan, sched, dout, act, dh, rows):
        """-> (dW1, dW2), stacked; or, where Megatron's main_grads take the gradients
        (plan.main_grads: gradient-accumulation fusion), (None, None) once they are added into
        them in fp32 in place (ops.grouped_wgrad_accumulate), as Megatron's fused linears do."""
        if plan.main_grads is not None:
            for a, b, grads in ((dout, act, plan.main_grads.dw2),
                                (dh, rows, plan.main_grads.dw1)):
                ops.grouped_wgrad_accumulate(a, b, sched.offsets, grads,
                                             timeout_ns=plan.ws.timeout_ns, rank=plan.ws.rank)
            return None, None
        dw2 = _grouped(dout.t(), act, sched.offs)
        dw1 = _grouped(dh.t(), rows, sched.offs)
        return dw1, dw2


class _QuantizedOperands(Bf16Operands, abc.ABC):
    """Forward and dgrad on the recipe's engine with the weights quantized once per optimizer
    step (``weights``: both orientations) and the activation operand prepared per call
    (``_prepare``: rounded or quantized along each row) - or dispatched so by the forward
    (``fc1_prepared``); wgrad rounds both operands along the expert's rows in blocks of
    ``block`` and runs torch._grouped_mm on the (exact in bf16) values."""

    block: int
    # What the FP8 wire's pull delivers to FC1 (separate_path.forward, then fc1_prepared):
    # codes and scale codes, or else bf16 rows of the codes' values.
    fc1_reads_codes: bool

    def __init__(self, weights):
        self.weights = weights

    @abc.abstractmethod
    def _prepare(self, sched, a):
        """The activation operand a [cap, K] as this recipe's engine reads it."""

    @abc.abstractmethod
    def _gemm(self, plan, sched, a, w, out, **epilogue):
        """out = epilogue(a w^T), a prepared (_prepare), w one orientation of ``weights``."""

    # Backward's operands in both forms from one pass (RoundedBoth): this recipe's ops over a
    # matrix (dh) and over the pulled rows (dY, the recomputed x).
    rounds_both = True
    _both_ways_op: Callable
    _pulled_both_ways_op: Callable

    def both_ways(self, sched, x):
        return RoundedBoth(*type(self)._both_ways_op(x, sched.offsets))

    def pulled_both_ways(self, sched, peer_bases, src_offset, max_tokens, topk, hidden):
        return RoundedBoth(*type(self)._pulled_both_ways_op(
            peer_bases, src_offset, sched.row_slot, sched.offsets, max_tokens, topk, hidden))


    def _along_k(self, sched, a):
        return a.along_k if isinstance(a, RoundedBoth) else self._prepare(sched, a)

    def keep_rows(self, sched, rows):
        return SegmentCodes(*ops.mx_quantize_segments(rows, sched.offsets, self.block))

    def _along_n(self, sched, a):
        if isinstance(a, RoundedBoth):
            return a.along_n
        if isinstance(a, SegmentCodes):
            return ops.mx_dequantize_segments(a.codes, a.scales, sched.offsets, self.block)
        return ops.mx_round_segments(a, sched.offsets, block=self.block)

    def fc1(self, plan, sched, rows, keep_h=True):
        return self.fc1_prepared(plan, sched, self._along_k(sched, rows), keep_h)

    def _k_rows_past(self, past, rows, first):
        """FC1's operand for the rows from `first` on (fc1_past), prepared along K."""
        return (self._k_rows_from(rows.along_k, first) if isinstance(rows, RoundedBoth)
                else self._prepare(past, rows[first:]))

    def fc1_past(self, plan, past, rows, first):
        # The engine's h comes with its activation epilogue (h_out), as forward made it.
        return self.fc1_prepared(plan, past, self._k_rows_past(past, rows, first))[0]

    @staticmethod
    @abc.abstractmethod
    def _k_rows_from(along_k, first: int):
        """The rows from `first` on (a multiple of 16) of an operand prepared along K."""

    def fc1_prepared(self, plan, sched, rows, keep_h=True):
        """FC1 of rows already prepared (pulled so: separate_path.forward): (h, act), h None
        unless keep_h (the epilogue then writes act alone)."""
        h = _rows(sched, plan.w1.shape[1]) if keep_h else None
        act = self._gemm(plan, sched, rows, self.weights.w1,
                         _rows(sched, plan.ffn), activation=plan.activation,
                         row_prob=sched.row_prob, h_out=h)
        return h, act

    def fc2(self, plan, sched, act):
        return self._gemm(plan, sched, self._prepare(sched, act), self.weights.w2,
                          _rows(sched, plan.w2.shape[1]))

    def fc2_dgrad(self, plan, sched, dout):
        return self._gemm(plan, sched, self._along_k(sched, dout), self.weights.w2_t,
                          _rows(sched, plan.ffn))

    def fc1_dgrad(self, plan, sched, dh):
        return self._gemm(plan, sched, self._along_k(sched, dh), self.weights.w1_t,
                          _rows(sched, plan.w1.shape[2]))

    def wgrad(self, plan, sched, dout, act, dh, rows):
        return super().wgrad(plan, sched,
                             *(self._along_n(sched, x) for x in (dout, act, dh, rows)))


class Mxfp8Operands(_QuantizedOperands):
    """MXFP8: the activation operand per 1 x 32 of each row, rounded per call on the GPU
    (csrc/quant/mx_round.cu; FC1's rows as the FP8 wire's pull delivers them), the weights per
    32 x 1 of each weight row, quantized once per optimizer step (mxfp8_weights.py), every
    forward and dgrad GEMM on the tile engine (FC1's activation its epilogue): with the
    weights as codes (Mxfp8Weights) it dequantizes them to bf16 in shared memory per tile,
    with their bf16 values (RoundedWeights, kernel.mxfp8_weights: rounded) it multiplies them
    as they are. Every product is one of MXFP8 values with fp32 accumulation (the reference's
    semantics)."""

    block = ops.MX_BLOCK
    fc1_reads_codes = False
    _both_ways_op = ops.mx_round_both
    _pulled_both_ways_op = ops.pull_rows_mx_round_both

    def _prepare(self, sched, a):
        return ops.mx_round_columns(a, sched.num_rows)

    @staticmethod
    def _k_rows_from(along_k, first):
        return along_k[first:]

    # The forward megakernel (recomputed backward inputs only: config.recipe_problems) pulls
    # x's FP8 wire rows as the separate path does, dequantized to the values FC1 reads, and
    # rounds act itself; its FC1 and FC2 are the tile engine's with either form of the
    # weights, so y is the separate path's bit for bit.
    def megakernel_weights(self, plan):
        w1, w2 = self.weights.w1, self.weights.w2
        if isinstance(w1, MxWeight):
            return dict(w1=w1.codes, w2=w2.codes, w1_scales=w1.scales, w2_scales=w2.scales,
                        mxfp8=True)
        return dict(w1=w1, w2=w2, mxfp8=True)

    # The backward megakernel (recomputed inputs, rounded weights: config.recipe_problems)
    # rounds dY, x, act and dh itself, as the separate backward's both-forms passes do, and
    # multiplies the rounded weights: FC1 again on W1 along H, the dgrads on the transposed
    # copies, K-major.
    def backward_megakernel_operands(self, plan, n):
        w = self.weights
        if isinstance(w.w1, MxWeight):
            raise NotImplementedError("mxfp8: the backward megakernel reads the weights as "
                                      "bf16 MXFP8 values (kernel.mxfp8_weights: rounded), not "
                                      "as codes (config.recipe_problems refuses it)")
        hidden, f1 = plan.w1.shape[2], plan.w1.shape[1]
        device = plan.w1.device
        return dict(w1=w.w1, w2=plan.w2, mxfp8=ops.MxBackwardOperands(
            w.w1_t, w.w2_t, _buffer(n, hidden, device), _buffer(n, hidden, device),
            _buffer(n, f1, device)))

    def _gemm(self, plan, sched, a, w, out, **epilogue):
        codes, scales = (w.codes, w.scales) if isinstance(w, MxWeight) else (w, None)
        ops.grouped_gemm(a, codes, sched.offsets, out, w_scales=scales,
                         timeout_ns=plan.ws.timeout_ns, rank=plan.ws.rank, **epilogue)
        return out


class Fp8BlockwiseOperands(_QuantizedOperands):
    """The blockwise FP8 engine (csrc/gemm/fp8_grouped_gemm.cu: E4M3 MMAs promoted per 128 of
    K): the activation operand as E4M3 codes per 1 x 128 of each row (quantized per call, or
    dispatched so by the forward), the weights per 128 x 128 block (fp8_block_weights.py);
    wgrad's operands rounded 128 x 1 along each expert's rows."""

    block = ops.FP8_BLOCK
    fc1_reads_codes = True
    _both_ways_op = ops.fp8_quantize_round_both
    _pulled_both_ways_op = ops.pull_rows_fp8_quantize_round_both

    def _prepare(self, sched, a):
        return ops.fp8_quantize_rows(a, sched.num_rows, block=self.block)

    @staticmethod
    def _k_rows_from(along_k, first):
        codes, scales = along_k  # scales transposed: [K blocks, rows padded to 16]
        return codes[first:], scales[:, first:]

    def fc1_past(self, plan, past, rows, first):
        # h alone, as the plain product on W1's codes: the bits of the activation epilogue's
        # h (both round the fp32 sums to bf16 once), without act's stores and math.
        return self._gemm(plan, past, self._k_rows_past(past, rows, first), self.weights.w1,
                          _rows(past, plan.w1.shape[1]))

    def _gemm(self, plan, sched, a, w, out, **epilogue):
        codes, scales = a  # ops.fp8_quantize_rows
        # Every GEMM on 192-column tiles (FC1's: 96 gate and 96 up weight rows): the 128
        # tiles' bits; FC2 and the dgrads 1.11-1.18x their rate on the EP64-equivalents since
        # the unrolled k-loop (one H100, docs/perf-log.md, Blockwise FP8, the consumer ladder).
        ops.fp8_grouped_gemm(codes, scales, w.codes, w.scales, sched.offsets, out,
                             timeout_ns=plan.ws.timeout_ns, rank=plan.ws.rank,
                             block_n=ops.FP8_WIDE_BLOCK_N, **epilogue)
        return out

    # The forward megakernel (recomputed backward inputs only: config.recipe_problems) pulls
    # x's wire rows as codes, runs every tile on the FP8 engine and quantizes act per 1 x 128
    # in its storer: the operands of this class's fc1_prepared and fc2, so y is the separate
    # path's bit for bit.
    def megakernel_weights(self, plan):
        w = self.weights
        return dict(w1=w.w1.codes, w2=w.w2.codes, w1_scales=w.w1.scales,
                    w2_scales=w.w2.scales, fp8_blockwise=True)

    def megakernel_rows(self, n, hidden, ffn, device):
        rows, rows_scales = ops.megakernel_fp8_rows(n, hidden, device)
        act, act_scales = ops.megakernel_fp8_rows(n, ffn, device)
        return dict(rows=rows, act=act, rows_scales=rows_scales, act_scales=act_scales)

    # The backward megakernel (recomputed inputs: config.recipe_problems) turns dY, x and dh
    # into codes along K and rounds them (and act) along the rows itself, as the separate
    # backward's both-forms passes do, runs FC1 again on W1's codes and the dgrads on the
    # transposed codes (the FP8 engine's tiles, bit for bit this class's fc1_prepared,
    # fc2_dgrad and fc1_dgrad), and the weight gradients on the rounded rows.
    def backward_megakernel_operands(self, plan, n):
        w = self.weights
        hidden, f1 = plan.w1.shape[2], plan.w1.shape[1]
        device = plan.w1.device
        return dict(w1=plan.w1, w2=plan.w2, fp8_blockwise=ops.Fp8BackwardOperands(
            (w.w1.codes, w.w1.scales), (w.w1_t.codes, w.w1_t.scales),
            (w.w2_t.codes, w.w2_t.scales), ops.megakernel_fp8_rows(n, hidden, device),
            ops.megakernel_fp8_rows(n, hidden, device), ops.megakernel_fp8_rows(n, f1, device)))
