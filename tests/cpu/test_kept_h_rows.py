"""Backward recomputing past kept h (kernel.kept_h_tokens) on CPU tensors: the schedule of the
rows past the head (the same torch ops run on the device), and the separate path's plumbing
around the kernels (FC1 by torch._grouped_mm, which runs on the CPU; the activation's backward
by a row-wise stand-in)."""

import pytest
import torch

from mok_megatron.cuda import separate_path
from mok_megatron.cuda.operands import Bf16Operands, Fp8BlockwiseOperands
from mok_megatron.cuda.plan import (Plan, Schedule, SplitH, h_past_kept, kept_h_rows,
                                   rows_past)


def _schedule(counts: list[int], capacity: int) -> Schedule:
    offsets = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    return Schedule(offsets, torch.arange(capacity, dtype=torch.int32),
                    torch.linspace(0, 1, capacity, dtype=torch.float32))


def test_rows_past_cuts_the_expert_the_head_ends_in():
    sched = _schedule([100, 300, 0, 400], capacity=1000)  # 800 rows, 200 unused
    past = rows_past(sched, 256)
    assert past.offsets.dtype == torch.int32
    assert past.offsets.tolist() == [0, 0, 144, 144, 544]  # expert 0 gone, expert 1 cut
    assert past.capacity == 744 and past.num_rows.tolist() == [544]
    assert torch.equal(past.row_slot, sched.row_slot[256:])
    assert torch.equal(past.row_prob, sched.row_prob[256:])
    # views: the recompute writes nothing of its own into the schedule
    assert past.row_slot.data_ptr() == sched.row_slot[256:].data_ptr()
    assert sched.offsets.tolist() == [0, 100, 400, 400, 800]


def test_rows_past_a_head_longer_than_the_rows():
    sched = _schedule([100, 28], capacity=512)
    past = rows_past(sched, 384)
    assert past.offsets.tolist() == [0, 0, 0] and past.num_rows.tolist() == [0]
    assert past.capacity == 128


def test_kept_h_rows_is_at_most_the_schedule():
    sched = _schedule([10, 20], capacity=300)
    plan = Plan.__new__(Plan)
    for kept, rows in ((0, 0), (256, 256), (384, 300)):
        plan.kept_h_tokens = kept
        assert kept_h_rows(plan, sched) == rows


def test_h_past_kept_recomputes_only_past_the_head():
    """Both recomputes' split (the separate path's and the megakernel path's): no head - FC1
    over the whole schedule; a head covering the schedule - no FC1; else FC1 on the schedule
    of the rows past the head, from its first row on."""
    sched = _schedule([100, 300, 0, 400], capacity=1000)
    calls = []

    def fc1_past(past, first):
        calls.append((past.offsets.tolist(), past.capacity, first))
        return torch.full((past.capacity, 8), float(first))

    whole = h_past_kept(sched, None, fc1_past)
    assert calls == [([0, 100, 400, 400, 800], 1000, 0)] and whole.shape == (1000, 8)
    calls.clear()
    head = torch.zeros(1024, 8)
    assert h_past_kept(sched, head, fc1_past) is head and calls == []
    split = h_past_kept(sched, head[:256], fc1_past)
    assert calls == [([0, 0, 144, 144, 544], 744, 256)]
    assert isinstance(split, SplitH) and split.head.shape == (256, 8)
    assert split.tail.shape == (744, 8) and bool((split.tail == 256).all())


def _plan(ffn: int, hidden: int, experts: int, gated: bool) -> Plan:
    plan = Plan.__new__(Plan)
    g = torch.Generator().manual_seed(0)
    f1 = 2 * ffn if gated else ffn
    plan.w1 = torch.randn(experts, f1, hidden, generator=g).to(torch.bfloat16)
    plan.activation = "swiglu" if gated else "squared_relu"
    return plan


def _fake_activation_backward(h, dact, row_prob, num_rows, activation, dh, act_out, dprob):
    """A row-wise stand-in for the CUDA kernel (ops.activation_backward): writes the first
    num_rows rows of the given outputs in place, as the kernel does."""
    n = int(num_rows[0])
    dh[:n] = (h[:n].float() * 2 + 1).to(dh.dtype)
    act_out[:n] = (dact[:n].float() * row_prob[:n, None]).to(act_out.dtype)
    dprob[:n] = h[:n].float().sum(1) + dact[:n].float().sum(1)


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("head", [128, 256, 640])
def test_backward_past_a_kept_head_is_backward_over_every_row(monkeypatch, gated, head):
    """The BF16 separate path's plumbing on CPU tensors (torch._grouped_mm runs on the CPU):
    FC1 on the rows past the head gives the rows of FC1 on every row, and the activation's
    backward over a SplitH writes every row's outputs where one launch over h whole does, and
    nothing past the schedule's rows."""
    monkeypatch.setattr(separate_path.ops, "activation_backward", _fake_activation_backward)
    hidden, ffn, experts, capacity = 32, 16, 4, 704
    plan = _plan(ffn, hidden, experts, gated)
    sched = _schedule([200, 0, 290, 110], capacity)  # 600 rows
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(capacity, hidden, generator=g).to(torch.bfloat16)
    whole = Bf16Operands().fc1_past(plan, sched, rows, 0)
    tail = Bf16Operands().fc1_past(plan, rows_past(sched, head), rows, head)
    assert tail.shape == (capacity - head, plan.w1.shape[1])
    assert torch.equal(tail[:max(0, 600 - head)], whole[head:600])
    kept = SplitH(whole[:head].clone(), tail)
    dact = torch.randn(capacity, ffn, generator=g).to(torch.bfloat16)
    split = separate_path._activation_backward(plan, sched, kept, dact)
    one = separate_path._activation_backward(plan, sched, whole, dact)
    for a, b in zip(split, one):
        assert torch.equal(a[:600], b[:600])


def test_fp8_rows_past_keep_the_engine_strides():
    """The blockwise engine's A operand from row `first` on: the codes' rows and the transposed
    scale codes' columns, a 16-byte aligned column range the launcher accepts (its stride
    checks: unit column stride, row stride a multiple of 16)."""
    codes = torch.zeros(300, 256, dtype=torch.float8_e4m3fn)
    scales = torch.zeros(2, 304, dtype=torch.uint8)
    past_codes, past_scales = Fp8BlockwiseOperands._k_rows_from((codes, scales), 128)
    assert past_codes.shape == (172, 256) and past_scales.shape == (2, 176)
    assert past_scales.stride() == (304, 1)
    assert (past_scales.data_ptr() - scales.data_ptr()) % 16 == 0
    assert past_codes.data_ptr() - codes.data_ptr() == 128 * 256
