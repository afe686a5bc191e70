"""Where a forward megakernel's time goes, block by block and tile by tile (one GPU, EP=1).

One traced launch per case (ops.megakernel_trace_buffer; csrc/megakernel/tile_trace.cuh) after
an untraced warm-up: every block records clock64 at its tiles' phase boundaries and globaltimer
/ clock64 at its start and end. Printed per case: the SM clock the stamps imply, the blocks'
span (first start to last end), the last block's start, the median start of a block's first
tile and the median tail (its last tile's end to the block's end), the pull's duration in the
row-pulling blocks (median-max), and per FC1 / FC2 tile the median of each phase: queue
(waiting for the tile's entry), mainloop, epilogue (of it, staging: rows written and handed to
the storer warp); in the producer: push (take + locate + queue), ready (rows or FC1 wait +
fence), loads (issuing the tile's loads); in consumer 0's storer warp: lag (handoff to taking
it), h (h's stores reading the slots), act (the activation), release (act's / FC2's stores
reading the slots), count, and hold (taking the tile to releasing its slots: the storer's
time per tile, which paces the consumer when it exceeds the next mainloop). Times in
microseconds at the implied clock. And how consumer 0's time from its first tile to its
block's end splits into each tile kind's queue, mainloop and epilogue (summed over the blocks
whose every tile is traced; rest: after the last tile). The traced launch runs the diagnostic
build of the kernel (the one the profiling variants use); `--skip` traces a profiling variant,
`--no-h` a forward that keeps no h. `--precision fp8_blockwise` traces the megakernel inside
the layer's no-grad forward (layer_problem.one_gpu_forward: the recipe's wire rows, codes and
block weights; no h), the launch made with a trace buffer added.

    python benchmarks/diagnostics/trace_tiles.py --models qwen3_30b_a3b_like --variants ep64 --tokens 2048 \
        --out trace.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# Run from anywhere: the repository (mok_megatron); this folder holds the rest.
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from mok_megatron.cuda import ops  # noqa: E402
from block_trace import block_spans, blocks_line, traced  # noqa: E402
from layer_problem import one_gpu_forward  # noqa: E402
from profile_megakernel import build, cases, megakernel  # noqa: E402

SLOT = {name: i for i, name in enumerate(ops.TRACE_SLOTS)}
TILE_PHASES = {"queue": ("tile_start", "tile_queued"), "mainloop": ("tile_queued", "mainloop_end"),
               "epilogue": ("mainloop_end", "tile_end"), "staging": ("mainloop_end", "staged"),
               "push": ("producer_start", "pushed"), "ready": ("pushed", "ready"),
               "loads": ("ready", "loads_issued"),
               "st_lag": ("staged", "storer_took"), "st_h": ("storer_took", "storer_h_out"),
               "st_act": ("storer_h_out", "storer_activated"),
               "st_release": ("storer_activated", "storer_released"),
               "st_count": ("storer_released", "storer_done"),
               "st_hold": ("storer_took", "storer_released")}


def traced_launch(p: dict, comm_blocks: int, skip: int = 0) -> torch.Tensor:
    trace = ops.megakernel_trace_buffer("cuda")
    megakernel(p, comm_blocks, skip, trace)()
    torch.cuda.synchronize()
    return trace.cpu()


def traced_layer_launch(model, experts: int, tokens: int, comm_blocks: int, seed: int,
                        precision: str) -> torch.Tensor:
    """The trace of the forward megakernel's launch in one no-grad layer forward under
    `precision`, after two untraced ones."""
    forward = one_gpu_forward(model, experts, tokens, "megakernel", comm_blocks, seed, precision)
    forward(), forward()
    torch.cuda.synchronize()
    trace = ops.megakernel_trace_buffer("cuda")
    with traced("moe_forward_megakernel", trace):
        forward()
    torch.cuda.synchronize()
    return trace.cpu()


def summarize(trace: torch.Tensor) -> dict:
    """Per-block spans and per-tile phase medians (µs) from one traced launch."""
    tiles, head = ops.megakernel_trace_parts(trace)
    ghz, blocks, whole = block_spans(tiles, head, SLOT["tile_start"], SLOT["tile_end"],
                                             ops.TRACE_TILES)
    us = lambda c: c / ghz / 1e3  # noqa: E731  (clock64 cycles -> µs)
    phases: dict[str, dict[str, list]] = {"fc1": {}, "fc2": {}}
    # Consumer 0's time from its first tile to the block's end, summed over the blocks whose
    # every tile is traced, split into each tile kind's queue / mainloop / epilogue.
    shares: dict[str, float] = {}
    consumer_cycles = sum(c for c in whole if c is not None)
    for b, n in enumerate(x["tiles"] for x in blocks):
        for s in range(n):
            row = tiles[b, s]
            kind = "fc1" if int(row[SLOT["tile_id"]]) % 2 else "fc2"
            for name, (a, z) in TILE_PHASES.items():
                if int(row[SLOT[a]]) and int(row[SLOT[z]]):
                    cycles = int(row[SLOT[z]] - row[SLOT[a]])
                    phases[kind].setdefault(name, []).append(us(cycles))
                    if whole[b] is not None and name in ("queue", "mainloop", "epilogue"):
                        shares[f"{kind}_{name}"] = shares.get(f"{kind}_{name}", 0) + cycles
    medians = {kind: {name: statistics.median(v) for name, v in d.items()}
               for kind, d in phases.items() if d}
    counts = {kind: len(d.get("mainloop", [])) for kind, d in phases.items()}
    consumer = ({k: v / consumer_cycles for k, v in sorted(shares.items())}
                if consumer_cycles else {})
    if consumer:
        consumer["rest"] = 1 - sum(consumer.values())
    return {"clock_ghz": ghz, "blocks": blocks, "tile_phase_median_us": medians,
            "tiles_traced": counts, "consumer_share": consumer}


def run_case(model, variant: str, experts: int, tokens: int, comm_blocks: int, seed: int,
             skip_names: list[str], no_h: bool = False, precision: str = "bf16") -> dict:
    skip = sum(ops.PROFILE_SKIP[name] for name in skip_names)
    comm_blocks = 0 if skip & ops.PROFILE_SKIP["pull"] else comm_blocks
    if precision == "bf16":
        p = build(model, experts, tokens, seed)
        if no_h:
            p["h"] = None
        warm = megakernel(p, comm_blocks, skip)
        warm(), warm()
        torch.cuda.synchronize()
        trace = traced_launch(p, comm_blocks, skip)
    else:
        trace = traced_layer_launch(model, experts, tokens, comm_blocks, seed, precision)
    s = summarize(trace)
    print(f"{model.name} {variant} E={experts} T={tokens} comm={comm_blocks}"
          + (f" skip={'+'.join(skip_names)}" if skip_names else "") + (" no h" if no_h else "")
          + (f" {precision}" if precision != "bf16" else "")
          + ": " + blocks_line(s["clock_ghz"], s["blocks"]), flush=True)
    if s["consumer_share"]:
        print("    consumer 0's time (blocks with every tile traced): "
              + " ".join(f"{k} {v:.0%}" for k, v in s["consumer_share"].items()), flush=True)
    for kind, med in s["tile_phase_median_us"].items():
        print(f"    {kind} ({s['tiles_traced'][kind]} tiles traced): "
              + " ".join(f"{k} {v:.2f}" for k, v in med.items()), flush=True)
    return {"model": model.name, "variant": variant, "experts": experts, "tokens": tokens,
            "comm_blocks": comm_blocks, "skip": skip_names, "precision": precision,
            "summary": s, "trace": trace.tolist()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen3_30b_a3b_like", "deepseek_v3_like"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[2048])
    ap.add_argument("--variants", nargs="+", default=["ep64"], choices=["full", "ep64"])
    ap.add_argument("--ep", type=int, default=4, help="GPUs the 'full' expert count is split over")
    ap.add_argument("--comm-sms", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", nargs="*", default=[], choices=list(ops.PROFILE_SKIP),
                    help="trace a profiling variant: these stages left out (no pull: no comm "
                    "blocks)")
    ap.add_argument("--no-h", action="store_true",
                    help="FC1 stores no h (backward_inputs: recomputed stores none)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp8_blockwise"],
                    help="fp8_blockwise: trace the layer's launch (keeps no h: --no-h implied; "
                    "no profiling variants)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.precision != "bf16" and args.skip:
        ap.error("--precision fp8_blockwise has no profiling variants (--skip)")
    results = []
    for model, variant, experts, tokens in cases(args):
        results.append(run_case(model, variant, experts, tokens, args.comm_sms, args.seed,
                                args.skip, args.no_h or args.precision != "bf16",
                                args.precision))
        torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
        args.out.write_text(json.dumps({"meta": meta, "results": results}))


if __name__ == "__main__":
    main()
