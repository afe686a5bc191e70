"""The backward megakernel's trace layout and benchmarks/diagnostics/trace_backward.py's summary
of a traced launch: ops' slot names and kinds are csrc's, in csrc's order; on a synthetic
trace whose phases are known, the implied clock, per-kind phase medians (epilogue steps named
per kind, dW tiles leaving a carry apart) and consumer 0's time split by kind over the blocks
whose every tile is traced."""

import re
import sys
from pathlib import Path

import pytest
import torch

from mok_megatron.cuda import ops

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "diagnostics"))
import trace_backward  # noqa: E402
from block_trace import HEADER  # noqa: E402

SLOT = trace_backward.SLOT
TAIL = 40
STORER = (6, 400, 20, 60)


def enum_names(path: Path, enum: str, prefix: str) -> list[str]:
    body = re.search(rf"enum {enum} : int {{(.*?)}};", path.read_text(), re.S).group(1)
    return re.findall(rf"\b{prefix}(\w+?)(?: = \d+)?,", body)


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_layout_is_csrc_layout():
    header = REPO / "csrc" / "megakernel" / "backward_trace.cuh"
    slots = [snake(n) for n in enum_names(header, "BackwardTraceSlot", "kBt")]
    assert tuple(slots) == ops.BACKWARD_TRACE_SLOTS
    tiles = re.search(r"kBackwardTraceTiles = (\d+);", header.read_text()).group(1)
    assert int(tiles) == ops.BACKWARD_TRACE_TILES
    kinds = enum_names(REPO / "csrc" / "megakernel" / "backward_tiles.cuh", "BackwardKind", "k")
    assert [snake(k) for k in kinds] == ["fc1", "dgrad2", "wgrad2", "dgrad1", "wgrad1",
                                         "round_in", "round_act", "round_dh"]
    assert tuple(snake(k) for k in kinds) == ops.BACKWARD_KINDS


# Per tile (cycles): kind, part, consumer phases (queue, inputs, mainloop, epilogue steps...,
# count), producer phases (take, push, ready, loads); handed-on kinds also get their storer's
# (STORER: lag, make, release, count).
TILES = [
    ("dgrad2", 0, (10, 20, 300, 5, 30, 15), (4, 2, 8, 200)),
    ("wgrad2", 0, (6, 0, 100, 3, 40, 1), (4, 2, 0, 90)),
    ("wgrad2", trace_backward.CARRY_OUT, (6, 0, 100, 0, 60, 7), (4, 2, 0, 90)),  # a carry
    ("dgrad1", 0, (8, 2, 200, 12, 6, 0), (4, 2, 30, 150)),
]


def synthetic_trace(tiles_per_block: list[int]) -> torch.Tensor:
    """Blocks running TILES round robin back to back, clock64 at 2 GHz."""
    width = ops.BACKWARD_TRACE_TILES * len(SLOT) + len(HEADER)
    trace = torch.zeros(len(tiles_per_block), width, dtype=torch.int64)
    all_tiles, all_heads = ops.backward_trace_parts(trace)
    consumer = ["tile_start", "tile_queued", "inputs_ready", "mainloop_end"]
    for b, n in enumerate(tiles_per_block):
        tiles, head = all_tiles[b], all_heads[b]
        head[HEADER["start_ns"]], head[HEADER["start_clock"]] = 1000, 10_000
        clock = 10_100
        for s in range(n):
            kind, part, phases, producer = TILES[s % len(TILES)]
            steps = len(phases) - 4
            names = consumer + [f"epilogue{i + 1}" for i in range(steps)] + ["tile_end"]
            if s < ops.BACKWARD_TRACE_TILES:
                row = tiles[s]
                t = clock
                row[SLOT["tile_start"]] = t
                for name, cycles in zip(names[1:], phases):
                    t += cycles
                    row[SLOT[name]] = t
                t = clock
                row[SLOT["producer_start"]] = t
                for name, cycles in zip(("taken", "pushed", "ready", "loads_issued"), producer):
                    t += cycles
                    row[SLOT[name]] = t
                if kind in ("dgrad2", "dgrad1"):
                    t = int(row[SLOT["epilogue2"]])
                    for name, cycles in zip(("storer_took", "storer_made", "storer_released",
                                             "storer_done"), STORER):
                        t += cycles
                        row[SLOT[name]] = t
                row[SLOT["tile_id"]] = 8 * s + ops.BACKWARD_KINDS.index(kind)
                row[SLOT["part"]] = part
                row[SLOT["rows"]] = 128
            clock += sum(phases)
        head[HEADER["end_clock"]] = clock + TAIL
        head[HEADER["end_ns"]] = 1000 + (clock + TAIL - 10_000) // 2
        head[HEADER["ticket"]] = b
    return trace


def test_medians_and_consumer_shares():
    s = trace_backward.summarize(synthetic_trace([4, 8, ops.BACKWARD_TRACE_TILES + 3]))
    assert s["clock_ghz"] == pytest.approx(2.0, rel=1e-3)
    med = s["tile_phase_median_us"]  # at the clock the integer ns imply (rel 1e-3)
    assert set(med) == {"dgrad2", "wgrad2", "wgrad2_carry", "dgrad1"}
    assert med["dgrad2"]["slots"] == pytest.approx(0.0025, rel=1e-3)
    assert med["dgrad2"]["handoff"] == pytest.approx(0.015, rel=1e-3)
    assert med["dgrad2"]["count"] == pytest.approx(0.0075, rel=1e-3)
    assert med["dgrad2"]["loads"] == pytest.approx(0.1, rel=1e-3)
    assert med["wgrad2_carry"]["dw_out"] == pytest.approx(0.03, rel=1e-3)
    assert med["dgrad1"]["handoff"] == pytest.approx(0.003, rel=1e-3)
    assert med["dgrad2"]["storer_make"] == pytest.approx(0.2, rel=1e-3)
    assert med["dgrad1"]["storer_count"] == pytest.approx(0.03, rel=1e-3)
    assert "storer_make" not in med["wgrad2"]
    # Only the first two blocks have every tile traced: 3 rounds of TILES, two tails.
    total = 3 * sum(sum(t[2]) for t in TILES) + 2 * TAIL
    share = s["consumer_share"]
    assert s["blocks_traced_whole"] == 2
    assert share["dgrad2_mainloop"] == pytest.approx(3 * 300 / total)
    assert share["dgrad2_epilogue"] == pytest.approx(3 * (5 + 30 + 15) / total)
    assert share["wgrad2_carry_epilogue"] == pytest.approx(3 * (0 + 60 + 7) / total)
    assert share["rest"] == pytest.approx(2 * TAIL / total)
    assert sum(share.values()) == pytest.approx(1.0)
