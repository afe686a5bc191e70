"""The schedule kernel (ops.build_schedule, a GPU counting sort) against the order it must
give - rows sorted by (expert position, source rank, token, slot) - computed here on the CPU,
with every rank's published routing in its own workspace-shaped buffer (EP up to 8 in one
process; the kernel only reads peers, no barrier is involved); and its capacity
(kernel.schedule_capacity): enough changes nothing, too little stops with a report."""

import subprocess
import sys

import pytest
import torch

from mok_megatron.cuda import ops
from mok_megatron.cuda.workspace import WorkspaceLayout

pytestmark = pytest.mark.gpu


def expected(ids, probs, max_tokens, topk, expert_begin, position):
    """offsets, row_slot, row_prob by a plain sort of (position, flat) on the CPU."""
    num_local = position.numel()
    keys, slots, values = [], [], []
    for src, (ids_r, probs_r) in enumerate(zip(ids, probs)):
        e = ids_r.flatten().long() - expert_begin
        local = (ids_r.flatten() >= 0) & (e >= 0) & (e < num_local)
        flat = src * max_tokens * topk + torch.arange(ids_r.numel())
        keys.append(position.long()[e[local]] * (1 << 32) + flat[local])
        slots.append(flat[local])
        values.append(probs_r.flatten()[local])
    keys, slots, values = torch.cat(keys), torch.cat(slots), torch.cat(values)
    order = torch.argsort(keys)
    counts = torch.bincount((keys[order] >> 32), minlength=num_local)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    return offsets.int(), slots[order].int(), values[order]


CASES = [
    # world, tokens per rank, max_tokens, topk, experts per rank, routing, seed
    (1, (512,), 512, 4, 8, "uniform", 0),
    (1, (1000,), 1000, 6, 300, "uniform", 1),  # 6000 slots: a partial last tile
    (2, (700, 0), 700, 2, 16, "hot", 2),  # a rank without tokens; one expert takes all
    (3, (1000, 999, 17), 1000, 6, 5, "unused", 3),  # ragged, unused slots (-1)
    (4, (4096,) * 4, 4096, 8, 64, "zipf", 4),  # 131072 slots, 32 tiles
    (8, tuple(300 + 11 * r for r in range(8)), 400, 1, 1, "uniform", 5),  # one local expert
]


def publish(case):
    """Every rank's routing of `case` in its own workspace-shaped buffer: (bases, workspace
    offsets, ids per rank, probs per rank, expert positions)."""
    world, tokens, max_tokens, topk, num_local, routing, seed = case
    g = torch.Generator().manual_seed(seed)
    num_experts = world * num_local
    layout = WorkspaceLayout(max_tokens, topk, hidden=8)
    o = layout.offsets()
    buffers, ids, probs = [], [], []
    for T in tokens:
        if routing == "hot":
            ids_r = torch.randint(0, num_experts, (T, topk), generator=g)
            ids_r[:, 0] = 0
        elif routing == "zipf":
            weights = (torch.randperm(num_experts, generator=g).double() + 1) ** -1.2
            ids_r = torch.multinomial(weights.expand(max(T, 1), -1), topk, generator=g)[:T]
        else:
            ids_r = torch.randint(0, num_experts, (T, topk), generator=g)
        if routing == "unused":
            ids_r[torch.rand(T, topk, generator=g) < 0.3] = -1
        probs_r = torch.rand(T, topk, generator=g)
        buf = torch.full((layout.nbytes,), 0xAB, dtype=torch.uint8, device="cuda")
        buf[o["count"]:o["count"] + 4].view(torch.int32).fill_(T)
        buf[o["ids"]:o["ids"] + T * topk * 4].view(torch.int32).copy_(ids_r.int().flatten())
        buf[o["probs"]:o["probs"] + T * topk * 4].view(torch.float32).copy_(probs_r.flatten())
        buffers.append(buf)
        ids.append(ids_r.int())
        probs.append(probs_r)
    bases = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device="cuda")
    position = torch.randperm(num_local, generator=g).int()  # expert -> its row in the weights
    # The buffers must outlive the kernels reading them through `bases`.
    return bases, o, ids, probs, position, buffers


def schedule(case, rank, published, capacity):
    world, tokens, max_tokens, topk, num_local, routing, seed = case
    bases, o, _, _, position, _ = published
    offsets = torch.full((num_local + 1,), -7, dtype=torch.int32, device="cuda")
    row_slot = torch.full((capacity,), -7, dtype=torch.int32, device="cuda")
    row_prob = torch.full((capacity,), float("nan"), device="cuda")
    ops.build_schedule(bases, o["ids"], o["probs"], o["count"], world, max_tokens, topk,
                       rank * num_local, position.cuda(), offsets, row_slot, row_prob)
    return offsets.cpu(), row_slot.cpu(), row_prob.cpu()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"ep{c[0]}_E{c[4]}_{c[5]}")
@pytest.mark.parametrize("rank", [0, -1], ids=["first_rank", "last_rank"])
def test_schedule_matches_sorted_order(case, rank):
    world, tokens, max_tokens, topk, num_local, routing, seed = case
    rank = rank % world
    published = publish(case)
    _, _, ids, probs, position, _ = published
    offsets, row_slot, row_prob = schedule(case, rank, published, world * max_tokens * topk)
    want_offsets, want_slot, want_prob = expected(ids, probs, max_tokens, topk,
                                                  rank * num_local, position)
    total = int(want_offsets[-1])
    assert torch.equal(offsets, want_offsets)
    assert torch.equal(row_slot[:total], want_slot)
    assert torch.equal(row_prob[:total], want_prob)
    # Entries past the last row are not written (nothing may read them).
    assert (row_slot[total:] == -7).all() and row_prob[total:].isnan().all()
    if total > 0:
        # A capacity of exactly the rows needed gives the same schedule.
        exact = schedule(case, rank, published, total)
        assert all(torch.equal(a, b) for a, b in zip(exact, (offsets, row_slot[:total],
                                                             row_prob[:total])))


def test_overflow_stops_with_a_report():
    """Fewer rows than the routing needs: the kernels stop and say how many were needed."""
    code = """
import torch
from mok_megatron.config import KernelKnobs, Recipe
from mok_megatron.functional import moe_experts
T, H, F, E = 64, 64, 32, 4
t = torch.arange(T, device="cuda")
ids = torch.stack([t % E, (t + 1) % E], dim=1)
probs = torch.full((T, 2), 0.5, device="cuda")
x = torch.randn(T, H, device="cuda").bfloat16()
w1 = torch.randn(E, 2 * F, H, device="cuda").bfloat16()
w2 = torch.randn(E, H, F, device="cuda").bfloat16()
recipe = Recipe(name="t", backend="cuda",
                kernel=KernelKnobs(max_tokens_per_rank=T, schedule_capacity=0.5))
moe_experts(x, ids, probs, w1, w2, group=None, activation="swiglu", recipe=recipe)
torch.cuda.synchronize()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert ("SCHEDULE OVERFLOW rank 0: 128 rows routed to its experts, capacity 64 rows"
            in proc.stdout), proc.stdout + proc.stderr
