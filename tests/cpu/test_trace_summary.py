"""benchmarks/diagnostics/trace_tiles.py's summary of a traced launch, on a synthetic trace
whose phases are known: the implied clock, per-phase medians, and consumer 0's time split
into each tile kind's queue / mainloop / epilogue over the blocks whose every tile is traced."""

import sys
from pathlib import Path

import pytest
import torch

from mok_megatron.cuda import ops

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics"))
import trace_tiles  # noqa: E402
from block_trace import HEADER  # noqa: E402

SLOT = trace_tiles.SLOT
# Per tile (cycles): queue, mainloop, staging, rest of the epilogue.
FC1_TILE = (10, 300, 5, 5)
FC2_TILE = (20, 100, 10, 10)
TAIL = 50


def synthetic_trace(tiles_per_block: list[int]) -> torch.Tensor:
    """Blocks running their tiles FC1, FC2, FC1, ... back to back, clock64 at 2 GHz."""
    width = ops.TRACE_TILES * len(SLOT) + len(HEADER)
    trace = torch.zeros(len(tiles_per_block), width, dtype=torch.int64)
    all_tiles, all_heads = ops.megakernel_trace_parts(trace)
    for b, n in enumerate(tiles_per_block):
        tiles, head = all_tiles[b], all_heads[b]
        head[HEADER["start_ns"]], head[HEADER["start_clock"]] = 1000, 10_000
        clock = 10_100
        for s in range(n):
            fc1 = s % 2 == 0
            queue, mainloop, staging, rest = FC1_TILE if fc1 else FC2_TILE
            if s < ops.TRACE_TILES:
                row = tiles[s]
                row[SLOT["tile_start"]] = clock
                row[SLOT["tile_queued"]] = clock + queue
                row[SLOT["mainloop_end"]] = clock + queue + mainloop
                row[SLOT["staged"]] = clock + queue + mainloop + staging
                row[SLOT["tile_end"]] = clock + queue + mainloop + staging + rest
                row[SLOT["tile_id"]] = 2 * s + (1 if fc1 else 0)
            clock += queue + mainloop + staging + rest
        head[HEADER["end_clock"]] = clock + TAIL
        head[HEADER["end_ns"]] = 1000 + (clock + TAIL - 10_000) // 2
        head[HEADER["ticket"]] = b
    return trace


def test_consumer_shares_and_medians():
    s = trace_tiles.summarize(synthetic_trace([4, 6, ops.TRACE_TILES + 2]))
    assert s["clock_ghz"] == pytest.approx(2.0, rel=1e-3)
    assert s["tile_phase_median_us"]["fc1"]["mainloop"] == pytest.approx(0.150)
    assert s["tile_phase_median_us"]["fc2"]["queue"] == pytest.approx(0.010)
    # Only the first two blocks have every tile traced: 5 FC1 and 5 FC2 tiles, two tails.
    total = 5 * sum(FC1_TILE) + 5 * sum(FC2_TILE) + 2 * TAIL
    share = s["consumer_share"]
    assert share["fc1_mainloop"] == pytest.approx(5 * FC1_TILE[1] / total)
    assert share["fc2_queue"] == pytest.approx(5 * FC2_TILE[0] / total)
    assert share["fc2_epilogue"] == pytest.approx(5 * sum(FC2_TILE[2:]) / total)
    assert share["rest"] == pytest.approx(2 * TAIL / total)
    assert sum(share.values()) == pytest.approx(1.0)
