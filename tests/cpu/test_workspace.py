"""The symmetric workspace's layout (mok_megatron/workspace.py): regions in order, aligned,
not overlapping; the `inputs` region only where backward recomputes from the token rows. The
rows a rank's schedule holds (kernel.schedule_capacity), the barriers a group launches, and
the publish op's argument checks."""

import pytest
import torch

from mok_megatron import ops
from mok_megatron.symm_moe import schedule_rows
from mok_megatron.workspace import Workspace, WorkspaceLayout


def test_regions_are_aligned_and_disjoint():
    layout = WorkspaceLayout(max_tokens=1000, topk=6, hidden=7168, inputs=True)
    offsets = layout.offsets()
    names = [n for n in offsets if n != "end"]
    starts = [offsets[n] for n in names] + [offsets["end"]]
    assert all(a % 256 == 0 for a in starts)
    assert starts == sorted(starts)
    assert offsets["slots"] - offsets["inputs"] >= 1000 * 7168 * 2
    assert offsets["end"] - offsets["slot_values"] >= 1000 * 6 * 4


def test_inputs_region_only_when_recomputing():
    saved = WorkspaceLayout(max_tokens=512, topk=2, hidden=256)
    recomputed = WorkspaceLayout(max_tokens=512, topk=2, hidden=256, inputs=True)
    assert recomputed.nbytes - saved.nbytes == 512 * 256 * 2
    assert not saved.matches(recomputed) and recomputed.matches(recomputed)


def test_schedule_rows_is_the_capacity_fraction_of_the_worst_case():
    # EP=4, 100 tokens per rank, top-2: the worst case is 800 rows on one rank.
    assert schedule_rows(4, 100, 2, 1.0) == 800
    assert schedule_rows(4, 100, 2, 0.25) == 200  # perfect balance
    assert schedule_rows(4, 100, 2, 0.2501) == 201  # rounded up, never below the fraction
    assert schedule_rows(4, 100, 2, 1e-9) == 1  # at least one row


def test_a_group_of_one_launches_no_barrier(monkeypatch):
    """Barriers order the ranks' writes for each other; a group of one has its own stream
    order, so it launches none, and a group of two launches each one."""
    launched = []
    monkeypatch.setattr(ops, "peer_barrier", lambda *args: launched.append(args))
    layout = WorkspaceLayout(max_tokens=8, topk=2, hidden=64)
    for world in (1, 2):
        ws = Workspace.__new__(Workspace)
        ws._setup(None, torch.device("cpu"), layout, 1000, 0, world)
        ws.peer_bases = None
        ws.barrier(ops.Stage.FORWARD_PUBLISHED)
    assert [args[5] for args in launched] == [2]  # peer_barrier(..., rank, world, ...)


def test_publish_inputs_refuses_host_tensors():
    layout = WorkspaceLayout(max_tokens=8, topk=2, hidden=64)
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    ids = torch.zeros(4, 2, dtype=torch.int64)
    buffer = torch.zeros(layout.nbytes, dtype=torch.uint8)
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        ops.publish_inputs(x, ids, torch.zeros(4, 2), buffer, layout.offsets(),
                           torch.zeros(4, 2, dtype=torch.int32))


def test_emulated_group_refuses_serialized_streams(monkeypatch):
    """With CUDA_DEVICE_MAX_CONNECTIONS=1 every stream shares one hardware queue and the
    emulated ranks' barriers would deadlock: refused before anything is allocated."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    layout = WorkspaceLayout(max_tokens=8, topk=2, hidden=64)
    with pytest.raises(RuntimeError, match="CUDA_DEVICE_MAX_CONNECTIONS=1 serializes them"):
        Workspace.emulated_group(2, torch.device("cpu"), layout, 1000)
