"""Host-side cost of one mok forward (CUDA backend, EP=1, no process group): the time the
host takes to issue a call, a call's time in a stream of calls (what training sees when the
host runs ahead), a call synchronized alone (what bench_moe times), and where the host time
goes: per op of mok_megatron.cuda.ops (and torch._grouped_mm) the host time of its calls, the rest
of the call's issue time being Python between them; then cProfile, top functions by own time.

    python benchmarks/diagnostics/profile_host.py --model qwen3_30b_a3b_like --experts 8 --tokens 2048
    python benchmarks/diagnostics/profile_host.py --tokens 4096 --precision fp8_blockwise \
        --forward-kernels separate
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import inspect
import pstats
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

# Run from anywhere: the repository (mok_megatron); this folder holds the rest.
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from layer_problem import one_gpu_forward  # noqa: E402
from mok_megatron.cuda import ops  # noqa: E402
from mok_megatron.config import load_model  # noqa: E402


def per_op_host_seconds(forward, calls: int, synchronized: bool = False) -> tuple[dict, float]:
    """Host seconds per forward spent inside each op of mok_megatron.cuda.ops and torch._grouped_mm
    (inclusive, outermost op only), and the forward's whole issue time; the ops are wrapped
    with timers for the measurement and restored after it. `synchronized`: the device idle
    before each call, as bench_moe times it (an op whose launch waits shows there)."""
    totals = defaultdict(float)
    depth = [0]

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            depth[0] += 1
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    totals[name] += time.perf_counter() - start
        return wrapper

    originals = {name: fn for name, fn in vars(ops).items()
                 if inspect.isfunction(fn) and fn.__module__ == ops.__name__}
    grouped_mm = torch._grouped_mm
    try:
        for name, fn in originals.items():
            setattr(ops, name, timed(name, fn))
        torch._grouped_mm = timed("torch._grouped_mm", grouped_mm)
        torch.cuda.synchronize()
        issued = 0.0
        for _ in range(calls):
            if synchronized:
                torch.cuda.synchronize()
            start = time.perf_counter()
            forward()
            issued += (time.perf_counter() - start) / calls
        torch.cuda.synchronize()
    finally:
        for name, fn in originals.items():
            setattr(ops, name, fn)
        torch._grouped_mm = grouped_mm
    return {k: v / calls for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}, issued


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3_30b_a3b_like")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--comm-sms", type=int, default=12)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "mxfp8", "fp8_blockwise"])
    ap.add_argument("--forward-kernels", nargs="+", default=["megakernel", "separate"],
                    choices=["megakernel", "separate"])
    ap.add_argument("--top", type=int, default=18, help="functions listed by cProfile")
    args = ap.parse_args(argv)

    model = load_model(args.model)
    for forward_kernel in args.forward_kernels:
        forward = one_gpu_forward(model, args.experts, args.tokens, forward_kernel,
                                  args.comm_sms, precision=args.precision)
        for _ in range(10):
            forward()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.calls):
            forward()
        issued = (time.perf_counter() - start) / args.calls
        torch.cuda.synchronize()
        streamed = (time.perf_counter() - start) / args.calls
        alone = []
        for _ in range(50):
            torch.cuda.synchronize()
            start = time.perf_counter()
            forward()
            torch.cuda.synchronize()
            alone.append(time.perf_counter() - start)
        print(f"{args.precision} {forward_kernel}: host issue {issued * 1e3:.3f} ms/call, stream "
              f"{streamed * 1e3:.3f} ms/call, synchronized alone (median) "
              f"{statistics.median(alone) * 1e3:.3f} ms")
        for synchronized in (False, True):
            per_op, issued = per_op_host_seconds(forward, 20, synchronized)
            print(f"host time per op and call, {'synchronized' if synchronized else 'streamed'} "
                  f"({issued * 1e6:.0f} us issue with the timers; "
                  f"{(issued - sum(per_op.values())) * 1e6:.0f} us outside the ops):")
            for name, sec in per_op.items():
                print(f"    {sec * 1e6:7.1f} us  {name}")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(100):
            forward()
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
