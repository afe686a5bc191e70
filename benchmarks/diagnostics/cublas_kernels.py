"""Which kernels cuBLAS runs for a dense FP8 GEMM of bench_gemm's blockwise comparison (its
blockwise 1 x 128 / 128 x 128 GEMM and _scaled_mm's per-tensor one) next to our FP8 engine on
the same problem, with each kernel's GPU time (torch.profiler): the kernel names give cuBLAS's
tile shape, cluster and schedule, what our engine's configuration is measured against.

    python benchmarks/diagnostics/cublas_kernels.py 32768 4096 7168

With --ncu the calls run three times each without the profiler, for Nsight Compute:

    ncu -k regex:"fp8_grouped_gemm|nvjet" --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        python benchmarks/diagnostics/cublas_kernels.py 32768 4096 7168 --ncu --only ours
"""

import argparse
import sys
from pathlib import Path

# Run from anywhere: the repository (mok_megatron) and scripts/ (the benchmarks' helpers).
REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench_gemm import dense_blockwise  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rows", type=int)
    p.add_argument("n", type=int)
    p.add_argument("k", type=int)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--ncu", action="store_true", help="no profiler: three calls of each")
    p.add_argument("--only", default=None, help="one of the calls (ours, scaled_mm, blockwise)")
    p.add_argument("--cluster-ctas", type=int, default=1, help="our engine's CTA pairs (2)")
    args = p.parse_args(argv)
    engine, cublas, agree = dense_blockwise(args.rows, args.n, args.k,
                                            cluster_ctas=args.cluster_ctas)
    a = torch.randn(args.rows, args.k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(args.n, args.k, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    calls = {"ours": engine,
             "scaled_mm per-tensor": lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                                              out_dtype=torch.bfloat16)}
    if isinstance(cublas, str):
        print(f"cuBLAS blockwise unavailable: {cublas}")
    else:
        calls["cuBLAS blockwise"] = cublas
        print(f"ours against cuBLAS blockwise: rel-L2 {agree:.1e}")
    flop = 2 * args.rows * args.n * args.k
    for name, fn in calls.items():
        if args.only and args.only not in name:
            continue
        if args.ncu:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            continue
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                fn()
            torch.cuda.synchronize()
        for e in prof.key_averages():
            if e.device_type.name != "CUDA" or e.count == 0 or e.key.startswith("Memset"):
                continue
            us = e.device_time_total / e.count
            print(f"{name:22s} {us:9.1f} us x{e.count:<3d} {flop / us / 1e6:6.0f} TF/s  {e.key}")


if __name__ == "__main__":
    main()
