"""What the megakernels' traces share (csrc/megakernel/tile_trace.cuh, BlockTrace): the launch
made with a trace buffer, the blocks' header (ops.TRACE_HEADER) and what it says - the SM clock
the stamps imply and each block's span. trace_tiles.py (forward) and trace_backward.py read
their tiles' own slots around it."""

from __future__ import annotations

import contextlib
import statistics

import torch

from mok_megatron.cuda import ops

HEADER = {name: i for i, name in enumerate(ops.TRACE_HEADER)}


@contextlib.contextmanager
def traced(launch: str, trace: torch.Tensor):
    """Within it, ops.<launch> (moe_forward_megakernel, moe_backward_megakernel) records into
    `trace`: the launch runs the kernel's diagnostic build."""
    original = getattr(ops, launch)
    setattr(ops, launch, lambda *args, **kwargs: original(*args, **kwargs, trace=trace))
    try:
        yield
    finally:
        setattr(ops, launch, original)


def block_spans(tiles: torch.Tensor, head: torch.Tensor, start: int, end: int,
                traced_tiles: int):
    """-> (SM clock in GHz, per block a dict of its span in µs and its traced tiles' count
    ("tiles"), per block consumer 0's cycles from its first tile to the block's end where every
    tile of the block is traced, else None). tiles [blocks, traced_tiles, slots] with `start` /
    `end` the slots of a tile's first and last consumer stamp; head [blocks, len(HEADER)]."""
    ns = head[:, HEADER["end_ns"]] - head[:, HEADER["start_ns"]]
    cycles = head[:, HEADER["end_clock"]] - head[:, HEADER["start_clock"]]
    ghz = float(cycles.sum()) / float(ns.sum())
    t0 = int(head[:, HEADER["start_ns"]].min())
    blocks, whole = [], []
    for b in range(head.shape[0]):
        n = int((tiles[b, :, end] != 0).sum())
        start_clock = int(head[b, HEADER["start_clock"]])
        end_clock = int(head[b, HEADER["end_clock"]])
        block = {"start_us": (int(head[b, HEADER["start_ns"]]) - t0) / 1e3,
                 "end_us": (int(head[b, HEADER["end_ns"]]) - t0) / 1e3, "tiles": n,
                 "ticket": int(head[b, HEADER["ticket"]])}
        if int(head[b, HEADER["pull_end_clock"]]):
            block["pull_us"] = (int(head[b, HEADER["pull_end_clock"]]) - start_clock) / ghz / 1e3
        if n:
            block["first_tile_us"] = (int(tiles[b, 0, start]) - start_clock) / ghz / 1e3
            block["tail_us"] = (end_clock - int(tiles[b, n - 1, end])) / ghz / 1e3
        blocks.append(block)
        whole.append(end_clock - int(tiles[b, 0, start]) if 0 < n < traced_tiles else None)
    return ghz, blocks, whole


def blocks_line(ghz: float, blocks: list) -> str:
    """The clock and the blocks' span (first start to last end), the last block's start, the
    median start of a block's first tile, the median tail and the pull's duration (median-max)
    in the pulling blocks."""
    span = max(x["end_us"] for x in blocks) - min(x["start_us"] for x in blocks)
    pulls = [x["pull_us"] for x in blocks if "pull_us" in x]
    return (f"clock {ghz:.2f} GHz, blocks span {span:.1f} us (last start "
            f"+{max(x['start_us'] for x in blocks):.1f}, median first tile "
            f"+{statistics.median(x.get('first_tile_us', 0) for x in blocks):.1f}, median tail "
            f"{statistics.median(x.get('tail_us', 0) for x in blocks):.1f}"
            + (f", pull {statistics.median(pulls):.1f}-{max(pulls):.1f}" if pulls else "") + ")")
