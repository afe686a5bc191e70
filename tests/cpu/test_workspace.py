"""The symmetric workspace's layout (mok_megatron/cuda/workspace.py): regions in order, aligned,
not overlapping; the `inputs` region only where backward recomputes from the token rows. The
rows a rank's schedule holds (kernel.schedule_capacity), the barriers a group launches, and
the publish op's argument checks."""

import pytest
import torch

from mok_megatron.cuda import ops
from mok_megatron.config import KernelKnobs, Recipe
from mok_megatron.cuda.symm_moe import fp8_wire_row, schedule_rows, workspace_layout
from mok_megatron.cuda.workspace import Workspace, WorkspaceLayout


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


@pytest.mark.parametrize("hidden,block,code_bytes,row_bytes", [
    (7168, 32, 7168, 7392),   # DeepSeek-V3: 224 scale codes, 0.516 of the bf16 row
    (7168, 128, 7168, 7232),  # 56 scale codes padded to 64
    (200, 32, 208, 224),      # codes padded to 16 bytes, 7 scale codes padded to 16
    (8, 128, 16, 32),         # a wire row longer than the bf16 row
])
def test_fp8_wire_row_bytes(hidden, block, code_bytes, row_bytes):
    wire = ops.Fp8WireRow(hidden, block)
    assert (wire.code_bytes, wire.row_bytes) == (code_bytes, row_bytes)
    assert wire.blocks == -(-hidden // block)


def test_tokens_region_holds_bf16_rows_and_fp8_wire_rows():
    """The `tokens` region carries forward's x as wire rows and backward's dY as bf16 rows:
    each row as long as the longer of the two."""
    plain = WorkspaceLayout(max_tokens=64, topk=2, hidden=7168, inputs=True)
    fp8 = WorkspaceLayout(max_tokens=64, topk=2, hidden=7168, inputs=True,
                          fp8_rows=ops.Fp8WireRow(7168, 32))
    assert fp8.offsets() == plain.offsets() and not fp8.matches(plain)
    tiny = WorkspaceLayout(max_tokens=64, topk=2, hidden=8, fp8_rows=ops.Fp8WireRow(8, 128))
    o = tiny.offsets()
    assert o["inputs"] - o["tokens"] >= 64 * 32  # the 32-byte wire row, not the 16-byte bf16 row


@pytest.mark.parametrize("precision,backward_inputs,forward_kernel,block", [
    ("bf16", "recomputed", "separate", None),
    ("mxfp8", "recomputed", "separate", 32),
    ("fp8_blockwise", "recomputed", "separate", 128),
    ("mxfp8", "saved", "separate", None),  # wgrad reads forward's bf16 rows
    ("fp8_blockwise", "saved", "separate", None),
    ("mxfp8", "recomputed", "megakernel", 32),  # its pull dequantizes them
])
def test_fp8_rows_on_the_wire_per_recipe(precision, backward_inputs, forward_kernel, block):
    recipe = Recipe(name="t", precision=precision, backend="cuda",
                    kernel=KernelKnobs(backward_inputs=backward_inputs,
                                       forward_kernel=forward_kernel))
    layout = workspace_layout(topk=2, hidden=256, recipe=recipe)
    if block is None:
        assert fp8_wire_row(256, recipe) is None and layout.fp8_rows is None
    else:
        assert layout.fp8_rows == fp8_wire_row(256, recipe) == ops.Fp8WireRow(256, block)


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
