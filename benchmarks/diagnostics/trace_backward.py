"""Where a backward megakernel's time goes, block by block and tile by tile (one GPU, EP=1).

Per case one untraced forward + backward, then a forward and a backward whose megakernel
launch records a trace (ops.backward_trace_buffer; csrc/megakernel/backward_trace.cuh; the
launch runs the kernel's diagnostic build). Printed per case: the SM clock the stamps imply,
the blocks' span (first start to last end), the last block's start, the median start of a
block's first tile and the median tail (its last tile's end to the block's end), the pull's
duration in the dY-pulling blocks (median-max); how consumer warpgroup 0's time from its first
tile to its block's end splits over the tile kinds (summed over the blocks whose every tile is
traced; rest: gaps and the tail); and per tile kind the median of each phase in microseconds
at the implied clock - consumer 0's queue (waiting for the tile's entry), inputs (its own
waits: the ring's done count at a macrobatch switch; a carried dW part's carry; a rounding
tile's input), mainloop (rounding tiles: the rounding), the epilogue's steps (EPILOGUE_STEPS:
staging slots freed by the storer, rows staged and handed on) and count; the producer's take
(the next index and this tile's decode), push (a free queue entry), ready (the tile's inputs)
and loads (issuing its loads, the stage ring's waits included); consumer 0's storer warp's
lag (handed on to taken), make (its activation backward, stores issued), release (the stores
reading the slots) and count (FC1, FC2-dgrad: the stores completing). dW tiles that leave a
carry are their own kind (wgrad*_carry). The FP8 recipes run on recomputed inputs only.

    python benchmarks/diagnostics/trace_backward.py --models qwen3_30b_a3b_like \\
        --variants full ep64 --tokens 4096 --inputs recomputed saved --out trace.json
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

from mok_megatron.config import KernelKnobs, Recipe  # noqa: E402
from mok_megatron.cuda import ops  # noqa: E402
from mok_megatron.functional import moe_experts  # noqa: E402
from block_trace import block_spans, blocks_line, traced  # noqa: E402
from profile_backward import problem  # noqa: E402
from profile_megakernel import cases  # noqa: E402

SLOT = {name: i for i, name in enumerate(ops.BACKWARD_TRACE_SLOTS)}
CARRY_OUT = 2  # csrc kPartCarryOut
# Consumer 0's stamps in order, and the phase each one ends (consumer shares).
CONSUMER = ("tile_start", "tile_queued", "inputs_ready", "mainloop_end", "epilogue1",
            "epilogue2", "tile_end")
ENDS = {"tile_queued": "queue", "inputs_ready": "inputs", "mainloop_end": "mainloop",
        "epilogue1": "epilogue", "epilogue2": "epilogue", "tile_end": "epilogue"}
# What the epilogue stamps mark per kind (backward_trace.cuh); the count follows the last.
EPILOGUE_STEPS = {"fc1": ("slots", "handoff"), "dgrad2": ("slots", "handoff"),
                  "dgrad1": ("slots", "handoff"), "wgrad": ("staging", "dw_out")}
# Consumer 0's storer warp on the tiles it takes (backward_storer.cuh).
STORER = {"storer_lag": ("epilogue2", "storer_took"), "storer_make": ("storer_took", "storer_made"),
          "storer_release": ("storer_made", "storer_released"),
          "storer_count": ("storer_released", "storer_done")}
PRODUCER = {"take": ("producer_start", "taken"), "push": ("taken", "pushed"),
            "ready": ("pushed", "ready"), "loads": ("ready", "loads_issued")}


def kind_of(row) -> str:
    kind = ops.BACKWARD_KINDS[int(row[SLOT["tile_id"]]) % 8]
    if kind.startswith("wgrad") and int(row[SLOT["part"]]) & CARRY_OUT:
        return kind + "_carry"
    return kind


def tile_phases(row, kind: str) -> dict[str, int]:
    """One traced tile's phases in cycles (those whose two stamps it has)."""
    def span(a, z):
        return int(row[SLOT[z]]) - int(row[SLOT[a]]) if row[SLOT[a]] and row[SLOT[z]] else None

    out = {"queue": span("tile_start", "tile_queued"),
           "inputs": span("tile_queued", "inputs_ready"),
           "mainloop": span("inputs_ready", "mainloop_end")}
    steps = EPILOGUE_STEPS.get("wgrad" if kind.startswith("wgrad") else kind, ())
    last = "mainloop_end"
    for i, name in enumerate(steps):
        out[name] = span(last, f"epilogue{i + 1}")
        last = f"epilogue{i + 1}" if row[SLOT[f"epilogue{i + 1}"]] else last
    out["count"] = span(last, "tile_end")
    out["epilogue"] = span("mainloop_end", "tile_end")
    for name, (a, z) in (PRODUCER | STORER).items():
        out[name] = span(a, z)
    return {k: v for k, v in out.items() if v is not None}


def summarize(trace: torch.Tensor) -> dict:
    """Per-block spans, per-kind phase medians (µs) and consumer 0's time split by kind from
    one traced launch (on the CPU)."""
    tiles, head = ops.backward_trace_parts(trace)
    ghz, blocks, whole = block_spans(tiles, head, SLOT["tile_start"], SLOT["tile_end"],
                                             ops.BACKWARD_TRACE_TILES)
    us = lambda c: c / ghz / 1e3  # noqa: E731  (clock64 cycles -> µs)
    phases, rows = {}, {}
    shares: dict[str, float] = {}
    consumer_cycles = sum(c for c in whole if c is not None)
    whole_blocks = sum(c is not None for c in whole)
    for b, n in enumerate(x["tiles"] for x in blocks):
        for row in tiles[b, :n].tolist():  # plain ints: per-element tensor reads are slow
            kind = kind_of(row)
            for name, c in tile_phases(row, kind).items():
                phases.setdefault(kind, {}).setdefault(name, []).append(us(c))
            rows.setdefault(kind, []).append(int(row[SLOT["rows"]]))
            if whole[b] is not None:
                # Each interval between present stamps goes to the phase its later one ends.
                stamps = [(name, int(row[SLOT[name]])) for name in CONSUMER if row[SLOT[name]]]
                for (_, a), (name, z) in zip(stamps, stamps[1:]):
                    key = f"{kind}_{ENDS[name]}"
                    shares[key] = shares.get(key, 0) + z - a
    medians = {kind: {name: statistics.median(v) for name, v in d.items()}
               for kind, d in sorted(phases.items())}
    consumer = ({k: v / consumer_cycles for k, v in sorted(shares.items())}
                if consumer_cycles else {})
    if consumer:
        consumer["rest"] = 1 - sum(consumer.values())
    return {"clock_ghz": ghz, "blocks": blocks, "tile_phase_median_us": medians,
            "tiles_traced": {k: len(v) for k, v in sorted(rows.items())},
            "median_rows": {k: statistics.median(v) for k, v in sorted(rows.items())},
            "consumer_share": consumer, "blocks_traced_whole": whole_blocks}


def traced_backward(model, experts: int, tokens: int, precision: str, inputs: str,
                    forward_kernel: str, comm_sms: int, main_grad: bool) -> torch.Tensor:
    """The trace of the backward megakernel's launch in one layer backward, after an untraced
    forward + backward (forward itself untraced)."""
    leaves, dy = problem(model, experts, tokens)
    x, ids, probs, w1, w2 = leaves
    if main_grad:
        for w in (w1, w2):
            w.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    recipe = Recipe(name="trace_backward", precision=precision, backend="cuda",
                    kernel=KernelKnobs(max_tokens_per_rank=tokens, forward_kernel=forward_kernel,
                                       comm_sms_forward=12, backward_kernel="megakernel",
                                       comm_sms_backward=comm_sms, backward_inputs=inputs))

    def forward():
        for t in leaves:
            t.grad = None
        return moe_experts(*leaves, recipe=recipe, accumulate_main_grad=main_grad)

    forward().backward(dy)
    torch.cuda.synchronize()
    trace = ops.backward_trace_buffer("cuda")
    y = forward()
    with traced("moe_backward_megakernel", trace):
        y.backward(dy)
    torch.cuda.synchronize()
    return trace.cpu()


def print_case(title: str, s: dict) -> None:
    print(f"{title}: " + blocks_line(s["clock_ghz"], s["blocks"]), flush=True)
    share = s["consumer_share"]
    if share:
        kinds = sorted({k.rsplit("_", 1)[0] for k in share if k != "rest"})
        parts = []
        for kind in kinds:
            mine = {p: share[f"{kind}_{p}"] for p in ("queue", "inputs", "mainloop", "epilogue")
                    if f"{kind}_{p}" in share}
            parts.append(f"{kind} {sum(mine.values()):.0%} ("
                         + " ".join(f"{k} {v:.0%}" for k, v in mine.items()) + ")")
        print(f"    consumer 0's time ({s['blocks_traced_whole']} blocks with every tile "
              f"traced): " + ", ".join(parts) + f", rest {share['rest']:.0%}", flush=True)
    for kind, med in s["tile_phase_median_us"].items():
        consumer = [k for k in med if k not in PRODUCER]
        print(f"    {kind} ({s['tiles_traced'][kind]} tiles, rows {s['median_rows'][kind]:.0f}): "
              + " ".join(f"{k} {med[k]:.2f}" for k in consumer) + " | producer "
              + " ".join(f"{k} {med[k]:.2f}" for k in PRODUCER if k in med), flush=True)


def trimmed(trace: torch.Tensor) -> list:
    """Per block its header and its traced tiles' rows (the rest of the buffer is zeros)."""
    tiles, head = ops.backward_trace_parts(trace)
    out = []
    for b in range(trace.shape[0]):
        n = int((tiles[b, :, SLOT["tile_end"]] != 0).sum())
        out.append({"header": head[b].tolist(), "tiles": tiles[b, :n].tolist()})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen3_30b_a3b_like", "deepseek_v3_like"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[4096])
    ap.add_argument("--variants", nargs="+", default=["ep64"], choices=["full", "ep64"])
    ap.add_argument("--ep", type=int, default=1,
                    help="GPUs the 'full' expert count is split over (1: all on this one, as "
                    "profile_backward.py runs it)")
    ap.add_argument("--precision", nargs="+", default=["bf16"],
                    choices=["bf16", "mxfp8", "fp8_blockwise"])
    ap.add_argument("--inputs", nargs="+", default=["recomputed", "saved"],
                    choices=["recomputed", "saved"], help="kernel.backward_inputs")
    ap.add_argument("--forward-kernel", default="megakernel", choices=["megakernel", "separate"])
    ap.add_argument("--comm-sms-backward", type=int, default=16)
    ap.add_argument("--main-grad", action="store_true",
                    help="the weight gradients added into fp32 main_grads "
                    "(gradient-accumulation fusion) instead of bf16 dW")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    results = []
    for model, variant, experts, tokens in cases(args):
        for precision in args.precision:
            for inputs in args.inputs:
                title = (f"{model.name} {variant} E={experts} T={tokens} {precision} {inputs} "
                         f"comm={args.comm_sms_backward}"
                         + (" main_grad" if args.main_grad else ""))
                if precision != "bf16" and inputs == "saved":
                    print(f"{title}: skipped (the FP8 recipes' backward megakernel runs on "
                          f"recomputed inputs only)", flush=True)
                    continue
                trace = traced_backward(model, experts, tokens, precision, inputs,
                                        args.forward_kernel, args.comm_sms_backward,
                                        args.main_grad)
                s = summarize(trace)
                print_case(title, s)
                results.append({"model": model.name, "variant": variant, "experts": experts,
                                "tokens": tokens, "precision": precision, "inputs": inputs,
                                "comm_blocks": args.comm_sms_backward,
                                "main_grad": args.main_grad, "summary": s,
                                "trace": trimmed(trace)})
                torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "slots": ops.BACKWARD_TRACE_SLOTS, "header": ops.TRACE_HEADER,
                "kinds": ops.BACKWARD_KINDS}
        args.out.write_text(json.dumps({"meta": meta, "results": results}))


if __name__ == "__main__":
    main()
