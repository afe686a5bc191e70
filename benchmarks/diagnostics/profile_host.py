"""Host-side cost of one mok forward (CUDA backend, EP=1, no process group): the time the
host takes to issue a call, a call's time in a stream of calls (what training sees when the
host runs ahead), a call synchronized alone (what bench_moe times), and where the host time
goes (cProfile, top functions by own time).

    python benchmarks/diagnostics/profile_host.py --model qwen3_30b_a3b_like --experts 8 --tokens 2048
    python benchmarks/diagnostics/profile_host.py --tokens 4096 --precision fp8_blockwise \
        --forward-kernels separate
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

# Run from anywhere: the repository (mok_megatron); this folder holds the rest.
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from layer_problem import one_gpu_forward  # noqa: E402
from mok_megatron.config import load_model  # noqa: E402


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
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(100):
            forward()
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
