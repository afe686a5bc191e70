"""The symmetric-memory workspace of an expert-parallel group.

One buffer per (EP group, device), allocated once through
``torch.distributed._symmetric_memory`` (ordinary peer mappings over NVLink; multicast is
never used) and reused by every MoE layer and step. Every rank holds the same layout, so a
peer's region is its base pointer plus the same offset:

    flags        [channels, MAX_RANKS] u32   barrier epochs written by peers
    count        int32                       tokens this rank published (T_r)
    ids, probs   [max_tokens, topk]          routing this rank published
    tokens       [max_tokens, H] bf16        x (forward) or dY (backward), pulled by owners;
                                             under an FP8 recipe forward's x as FP8 wire rows
                                             (ops.Fp8WireRow) instead
    inputs       [max_tokens, H] bf16        x again in backward, only with
                                             kernel.backward_inputs: recomputed
    slots        [max_tokens * topk, H] bf16 owner results pushed back, one per (token, k)
    slot_values  [max_tokens * topk] fp32    owner dprobs pushed back, one per (token, k)

Sizing is for the worst case - every token of every rank may route to one rank - so no
routing skew can overflow it; ``max_tokens`` is the recipe's ``max_tokens_per_rank``.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from . import ops

log = logging.getLogger(__name__)

_ALIGN = 256


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class WorkspaceLayout:
    max_tokens: int
    topk: int
    hidden: int
    inputs: bool = False  # the `inputs` region (backward recomputes from the token rows)
    # Forward publishes x as these FP8 wire rows in the `tokens` region (None: bf16 rows).
    fp8_rows: Optional[ops.Fp8WireRow] = None

    @property
    def token_row_bytes(self) -> int:
        """Bytes per row of the `tokens` region: a bf16 row, or forward's wire row if longer."""
        wire = 0 if self.fp8_rows is None else self.fp8_rows.row_bytes
        return max(self.hidden * 2, wire)

    def offsets(self) -> dict[str, int]:
        sizes = {
            "flags": ops.NUM_BARRIER_CHANNELS * ops.MAX_RANKS * 4,
            "count": 4,
            "ids": self.max_tokens * self.topk * 4,
            "probs": self.max_tokens * self.topk * 4,
            "tokens": self.max_tokens * self.token_row_bytes,
            "inputs": self.max_tokens * self.hidden * 2 if self.inputs else 0,
            "slots": self.max_tokens * self.topk * self.hidden * 2,
            "slot_values": self.max_tokens * self.topk * 4,
        }
        out, at = {}, 0
        for name, size in sizes.items():
            out[name] = at
            at += _align(size)
        out["end"] = at
        return out

    @property
    def nbytes(self) -> int:
        return self.offsets()["end"]

    def matches(self, other: "WorkspaceLayout") -> bool:
        return self == other  # every field shapes the buffer


class Workspace:
    """Symmetric buffers + barrier state for one EP group on one device."""

    def __init__(self, group: Optional[dist.ProcessGroup], device: torch.device,
                 layout: WorkspaceLayout, timeout_ms: int):
        world = 1 if group is None else dist.get_world_size(group)
        rank = 0 if group is None else dist.get_rank(group)
        self._setup(group, device, layout, timeout_ms, rank, world)
        if world == 1:
            self.buffer = self._zeroed_buffer()
            self._handle = None
            bases = [self.buffer.data_ptr()]
        else:
            import torch.distributed._symmetric_memory as symm_mem

            self.buffer = self._zeroed_buffer(symm_mem.empty)
            # Peers may signal as soon as the rendezvous returns: the zeroed flags must be in
            # memory before then.
            torch.cuda.synchronize(device)
            self._handle = symm_mem.rendezvous(self.buffer, group)
            bases = list(self._handle.buffer_ptrs)
        self.peer_bases = torch.tensor(bases, dtype=torch.int64, device=device)
        log.info("mok workspace: %d ranks, %.1f MiB per GPU (max_tokens=%d, topk=%d, H=%d)",
                 self.world, layout.nbytes / 2**20, layout.max_tokens, layout.topk,
                 layout.hidden)

    @classmethod
    def emulated_group(cls, world: int, device: torch.device, layout: WorkspaceLayout,
                       timeout_ms: int) -> list["Workspace"]:
        """The workspaces of `world` EP ranks emulated on one device in one process: every
        rank has its own buffer and sees the others' as its peers, so the multi-rank protocol
        (schedule over all ranks' routing, pulls from and pushes to peers, barriers) runs
        without a multi-GPU machine. Each rank must be driven from its own thread on its own
        stream: the barriers wait for the other ranks. For tests; no NVLink is involved."""
        if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
            # One hardware queue for all streams: a rank's barrier would wait forever for a
            # kernel queued behind it, then trap and take the CUDA context with it.
            raise RuntimeError(
                "an emulated EP group needs concurrent CUDA streams, but "
                "CUDA_DEVICE_MAX_CONNECTIONS=1 serializes them; unset it before the process "
                "creates its CUDA context (the test suite's conftest does)")
        group = []
        for rank in range(world):
            ws = cls.__new__(cls)
            ws._setup(None, device, layout, timeout_ms, rank, world)
            ws.buffer = ws._zeroed_buffer()
            ws._handle = None
            group.append(ws)
        torch.cuda.synchronize(device)
        bases = torch.tensor([ws.buffer.data_ptr() for ws in group], dtype=torch.int64,
                             device=device)
        for ws in group:
            ws.peer_bases = bases
        return group

    def _setup(self, group, device, layout, timeout_ms, rank, world) -> None:
        if world > ops.MAX_RANKS:
            raise ValueError(
                f"EP group of {world} ranks: the mok kernels support at most "
                f"{ops.MAX_RANKS} GPUs in one NVLink domain")
        self.group = group
        self.device = device
        self.layout = layout
        self.world = world
        self.rank = rank
        self.timeout_ns = int(timeout_ms) * 1_000_000
        self.offsets = layout.offsets()
        self.epochs = torch.zeros(ops.NUM_BARRIER_CHANNELS, dtype=torch.int32, device=device)

    def _zeroed_buffer(self, empty=torch.empty) -> torch.Tensor:
        """The workspace memory, its barrier flags and count zeroed."""
        buffer = empty(self.layout.nbytes, dtype=torch.uint8, device=self.device)
        buffer[: self.offsets["count"]].zero_()
        return buffer

    def _view(self, region: str, shape, dtype) -> torch.Tensor:
        start = self.offsets[region]
        nbytes = math.prod(shape) * dtype.itemsize
        return self.buffer[start:start + nbytes].view(dtype).view(shape)

    def tokens(self, tokens: int) -> torch.Tensor:
        return self._view("tokens", (tokens, self.layout.hidden), torch.bfloat16)

    def inputs(self, tokens: int) -> torch.Tensor:
        if not self.layout.inputs:
            raise RuntimeError("this workspace has no inputs region (backward_inputs: saved)")
        return self._view("inputs", (tokens, self.layout.hidden), torch.bfloat16)

    def slots(self, tokens: int, topk: int) -> torch.Tensor:
        return self._view("slots", (tokens * topk, self.layout.hidden), torch.bfloat16)

    def slot_values(self, tokens: int, topk: int) -> torch.Tensor:
        return self._view("slot_values", (tokens * topk,), torch.float32)

    def barrier(self, stage: ops.Stage, channel: int = 0) -> None:
        """Every rank of the group has reached `stage` (its writes before it are visible to
        all). A group of one has no one to wait for: its stream already orders them."""
        if self.world == 1:
            return
        ops.peer_barrier(self.peer_bases, self.offsets["flags"], self.epochs, channel,
                         self.rank, self.world, self.timeout_ns, stage)


_workspaces: dict[tuple, Workspace] = {}


def _key(group: Optional[dist.ProcessGroup], device: torch.device) -> tuple:
    return (None if group is None else group.group_name, device)


def get_workspace(group: Optional[dist.ProcessGroup], device: torch.device,
                  layout: WorkspaceLayout, timeout_ms: int) -> Workspace:
    """The group's workspace, created on first use (a collective: every rank of the group
    reaches it in the same call, since layouts depend only on shapes shared by all ranks)."""
    key = _key(group, device)
    ws = _workspaces.get(key)
    if ws is not None and ws.layout.matches(layout) and ws.timeout_ns == timeout_ms * 1_000_000:
        return ws
    if ws is not None:
        release_workspace(group, device)
    ws = Workspace(group, device, layout, timeout_ms)
    _workspaces[key] = ws
    return ws


def release_workspace(group: Optional[dist.ProcessGroup], device: torch.device) -> None:
    """Free the group's workspace. A collective: every rank synchronizes and meets the others
    first, so no peer still reads or writes the buffers when they go."""
    ws = _workspaces.pop(_key(group, device), None)
    if ws is not None:
        torch.cuda.synchronize(device)
        if ws.world > 1:
            dist.barrier(group)
        ws._handle = None
        ws.buffer = None


def workspace_bytes(group: Optional[dist.ProcessGroup], device: torch.device) -> int:
    ws = _workspaces.get(_key(group, device))
    return 0 if ws is None else ws.layout.nbytes
