"""Which operand layouts does torch._grouped_mm take without hidden copies? Times each GEMM
of the v1 path at one shape and reports the extra memory it allocated beyond its output: a
copy of the weights shows up as both time and memory. One GPU.

    python benchmarks/diagnostics/probe_grouped_mm.py --experts 192 --rows-per-expert 64 --hidden 7168 --ffn 3072
"""

import argparse
import sys
from pathlib import Path

# Run from anywhere: the repository (mok_megatron) and scripts/ (the benchmarks' helpers).
REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import torch  # noqa: E402

from gpu_timing import mean_seconds  # noqa: E402


def measure(fn, iters=5):
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - out.numel() * out.element_size()
    del out
    return mean_seconds(fn, iters, warmup=0) * 1e3, extra


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--experts", type=int, default=192)
    p.add_argument("--rows-per-expert", type=int, default=64)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--ffn", type=int, default=3072)
    a = p.parse_args()
    E, R, H, F = a.experts, a.rows_per_expert, a.hidden, a.ffn
    dev, bf = "cuda", torch.bfloat16
    w1 = torch.randn(E, 2 * F, H, device=dev, dtype=bf)
    rows = torch.randn(E * R, H, device=dev, dtype=bf)
    dh = torch.randn(E * R, 2 * F, device=dev, dtype=bf)
    offs = (torch.arange(1, E + 1, device=dev, dtype=torch.int32) * R)
    wbytes = w1.numel() * 2
    cases = {
        "fwd  rows @ w1^T   (B = w1.transpose, column-major)":
            lambda: torch._grouped_mm(rows, w1.transpose(1, 2), offs=offs),
        "dgrad dh @ w1      (B = w1, row-major)":
            lambda: torch._grouped_mm(dh, w1, offs=offs),
        "wgrad dh^T @ rows  (A = dh.t() view)":
            lambda: torch._grouped_mm(dh.t(), rows, offs=offs),
        "wgrad dh^T @ rows  (A = dh.t().contiguous())":
            lambda: torch._grouped_mm(dh.t().contiguous(), rows, offs=offs),
    }
    print(f"E={E} rows/expert={R} H={H} F={F}: w1 {wbytes / 1e9:.1f} GB, read alone "
          f"{wbytes / 4.2e12 * 1e3:.2f} ms at 4.2 TB/s")
    for name, fn in cases.items():
        ms, extra = measure(fn)
        print(f"{name}: {ms:7.2f} ms, extra memory {extra / 1e9:6.2f} GB")


if __name__ == "__main__":
    main()
