"""Where a synchronized MoE call's wall time goes that its kernels do not cover: one training
forward (autograd on), its backward, and a no-grad forward (what bench_moe's "fwd" times) at
EP=1, per recipe and forward kernel; with --precondition each phase starts after bench_moe's
0.3 s of dense matmuls (gpu_timing.precondition), as bench_moe's timings do. For each call:
its wall time between two events (no profiler), the host's time to issue it, and, from one
profiled call (torch.profiler, CPU and CUDA), every GPU activity in order with when the host
launched it, when it started, and the GPU's idle gap before it - with the host's CPU ops that
ran in that gap's launch interval (what the GPU waited for).

    python benchmarks/diagnostics/timeline.py --model deepseek_v3_like --variant ep64 \
        --settings "bf16 separate" "fp8_blockwise megakernel" --out timeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from profile_backward import variant_problem, write_runs  # also puts the repository on the path
from profile_recipes import SETTINGS, training_forward

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from gpu_timing import precondition  # noqa: E402

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "user_annotation", "python_function")


def device_mallocs() -> tuple[int, int]:
    """The caching allocator's cudaMalloc and cudaFree calls so far (a cudaFree synchronizes
    the device, so one inside a call holds the host until the GPU is idle)."""
    stats = torch.cuda.memory_stats()
    return stats.get("num_device_alloc", 0), stats.get("num_device_free", 0)


def wall_and_issue(prepare, run, iters: int) -> tuple[float, float]:
    """Median microseconds of a synchronized call between two events, and of the host's time
    from the call's start to its return."""
    walls, issues = [], []
    for _ in range(iters):
        arg = prepare()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        run(arg)
        issues.append((time.perf_counter() - t0) * 1e6)
        end.record()
        torch.cuda.synchronize()
        walls.append(start.elapsed_time(end) * 1e3)
    return statistics.median(walls), statistics.median(issues)


def profiled_trace(prepare, run, stack: bool) -> list[dict]:
    """The chrome-trace events of one profiled call of run(prepare())."""
    arg = prepare()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, with_stack=stack) as prof:
        with torch.profiler.record_function("timeline_call"):
            run(arg)
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        return json.loads(Path(path).read_text())["traceEvents"]
    finally:
        os.unlink(path)


def gaps(events: list[dict], min_gap_us: float, top_ops: int) -> dict:
    """The call's GPU activities in order (launch, start, duration, idle gap before each, in
    microseconds from the call's start) and, for each gap of at least min_gap_us, the longest
    host ops inside the interval between the previous launch and this one, and the innermost
    op around it."""
    call = next(e for e in events if e.get("name") == "timeline_call"
                and e.get("cat") == "user_annotation")
    t0 = call["ts"]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATEGORIES), key=lambda e: e["ts"])
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES and e.get("ph") == "X"
            and e.get("name") != "timeline_call"]
    rows, prev_end, prev_launch = [], t0, t0
    for e in gpu:
        launch = launches.get(e.get("args", {}).get("correlation"))
        launch_ts = launch["ts"] if launch else e["ts"]
        gap = e["ts"] - prev_end
        row = {"name": e["name"][:100], "launch_us": launch_ts - t0, "start_us": e["ts"] - t0,
               "dur_us": e["dur"], "gap_us": gap}
        if gap >= min_gap_us:
            # The host ops inside the launch interval, longest first (a nested chain reads as
            # the path down to what took the time), and the innermost op around all of it.
            lo, hi = prev_launch, launch_ts
            inside = sorted(((h["dur"], h["name"][:80]) for h in host
                             if h["ts"] >= lo and h["ts"] + h["dur"] <= hi), reverse=True)
            around = [h for h in host if h["ts"] <= lo and h["ts"] + h["dur"] >= hi]
            row["host_ops_in_gap"] = [f"{d:.0f} us {n}" for d, n in inside[:top_ops]]
            if around:
                row["host_op_around_gap"] = min(around, key=lambda h: h["dur"])["name"][:80]
        rows.append(row)
        prev_end = max(prev_end, e["ts"] + e["dur"])
        prev_launch = launch_ts
    busy = sum(r["dur_us"] for r in rows)
    # The host's longest CUDA runtime and driver calls of the call (a synchronizing one - a
    # cudaFree, a stream or event synchronization, a blocking copy - holds the host there).
    runtime = sorted(((e["dur"], e["name"]) for e in events
                      if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X"
                      and call["ts"] <= e["ts"] <= call["ts"] + call["dur"]), reverse=True)
    return {"host_span_us": call["dur"], "gpu_end_us": prev_end - t0, "gpu_busy_us": busy,
            "longest_runtime_calls": [f"{d:.0f} us {n}" for d, n in runtime[:top_ops]],
            "activities": rows}


def run_setting(inputs, dy, precision, forward_kernel, tokens, args) -> dict:
    forward = training_forward(inputs, precision, forward_kernel, tokens)

    def backward(y):
        y.backward(dy)

    def forward_no_grad(_=None):
        with torch.no_grad():
            return forward()

    for _ in range(3):  # warm-up: workspaces, and the quantized weights' cache
        forward().backward(dy)
    out = {}
    for phase, prepare, run in (("forward", lambda: None, forward),
                                ("backward", forward, backward),
                                ("no-grad forward", lambda: None, forward_no_grad)):
        if args.precondition:
            precondition()
        mallocs = device_mallocs()
        wall, issue = wall_and_issue(prepare, run, args.iters)
        allocs, frees = (b - a for a, b in zip(mallocs, device_mallocs()))
        out[phase] = {"wall_us": wall, "host_issue_us": issue,
                      "cuda_mallocs_per_call": allocs / args.iters,
                      "cuda_frees_per_call": frees / args.iters,
                      **gaps(profiled_trace(prepare, run, args.stack), args.min_gap_us,
                             args.top_ops)}
    return out


def print_phase(name: str, phase: str, r: dict) -> None:
    print(f"{name} {phase}: wall {r['wall_us']:.0f} us (no profiler), host issue "
          f"{r['host_issue_us']:.0f} us; profiled: host span {r['host_span_us']:.0f}, GPU end "
          f"{r['gpu_end_us']:.0f}, GPU busy {r['gpu_busy_us']:.0f} us; cudaMalloc / cudaFree "
          f"per call {r['cuda_mallocs_per_call']:.1f} / {r['cuda_frees_per_call']:.1f}")
    print("    longest runtime calls: " + "; ".join(r["longest_runtime_calls"]))
    for a in r["activities"]:
        print(f"    launch {a['launch_us']:8.1f}  start {a['start_us']:8.1f}  dur "
              f"{a['dur_us']:8.1f}  gap {a['gap_us']:7.1f}  {a['name'][:70]}")
        if "host_op_around_gap" in a:
            print(f"            host, around the launch interval: {a['host_op_around_gap']}")
        for op in a.get("host_ops_in_gap", []):
            print(f"            host: {op}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3_30b_a3b_like")
    p.add_argument("--variant", default="ep64", choices=["full", "ep64"])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--iters", type=int, default=20, help="synchronized calls timed per phase")
    p.add_argument("--min-gap-us", type=float, default=5.0)
    p.add_argument("--top-ops", type=int, default=8)
    p.add_argument("--stack", action="store_true", help="Python functions in the host ops")
    p.add_argument("--precondition", action="store_true",
                   help="0.3 s of dense matmuls before each phase, as bench_moe")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    spec, inputs, dy = variant_problem(args)
    runs = {}
    for name in args.settings:
        runs[name] = run_setting(inputs, dy, *SETTINGS[name], args.tokens, args)
        for phase in runs[name]:
            print_phase(f"{args.model} {args.variant} E={spec.num_experts} T={args.tokens} "
                        f"{name}", phase, runs[name][phase])
    write_runs(args, runs)


if __name__ == "__main__":
    main()
