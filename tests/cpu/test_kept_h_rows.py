"""The row ranges of backward recomputing past kept h (kernel.kept_h_tokens): the schedule of
the rows past the head, on CPU tensors (the same torch ops run on the device)."""

import torch

from mok_megatron.cuda.plan import Plan, Schedule, kept_h_rows, rows_past


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
