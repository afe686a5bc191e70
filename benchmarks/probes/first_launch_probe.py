"""Why the first launch of a synchronized MoE call can hold the host for ~0.5 ms (2026-12-05,
docs/perf-log.md "Blockwise FP8", timeline.py: the first cudaLaunchKernel of the blockwise
megakernel forward 442-475 us, the first copy of its backward 556 us, bf16's 59-107 us): after
each kernel below runs and the device is idle, the host time of the next launch (a one-element
add) and of the one after it, with the context's stack-size limit and local-memory flag as the
driver reports them; then the same after bench_moe's preconditioning matmuls (the first card
timed, without them, showed no idle gap), with the stack limit raised once (cuCtxSetLimit) and
with CU_CTX_LMEM_RESIZE_TO_MAX set (cuCtxSetFlags) - whether local memory resized back and forth
around our kernels is the cause.

    python benchmarks/probes/first_launch_probe.py
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks" / "diagnostics"))
sys.path.insert(0, str(REPO / "scripts"))

from gpu_timing import precondition  # noqa: E402
from layer_problem import one_gpu_forward  # noqa: E402
from mok_megatron.cuda import ops  # noqa: E402
from mok_megatron.config import load_model  # noqa: E402

CU_LIMIT_STACK_SIZE = 0
CU_CTX_LMEM_RESIZE_TO_MAX = 0x10
cuda = ctypes.CDLL("libcuda.so.1")


def stack_limit() -> int:
    v = ctypes.c_size_t()
    assert cuda.cuCtxGetLimit(ctypes.byref(v), CU_LIMIT_STACK_SIZE) == 0
    return v.value


def ctx_flags() -> int:
    v = ctypes.c_uint()
    assert cuda.cuCtxGetFlags(ctypes.byref(v)) == 0
    return v.value


def next_launch_us(kernel, reps: int = 10) -> tuple[float, float]:
    """Median host microseconds of the first and second launch after `kernel` ran."""
    probe = torch.zeros(1, device="cuda")
    first, second = [], []
    for _ in range(reps):
        kernel()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        probe.add_(1)
        t1 = time.perf_counter()
        probe.add_(1)
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        first.append((t1 - t0) * 1e6)
        second.append((t2 - t1) * 1e6)
    return statistics.median(first), statistics.median(second)


def kernels() -> dict:
    model = load_model("deepseek_v3_like")
    out = {}
    for precision, fk in (("bf16", "separate"), ("fp8_blockwise", "separate"),
                          ("fp8_blockwise", "megakernel"), ("bf16", "megakernel")):
        f = one_gpu_forward(model, 8, 4096, fk, 16, precision=precision)
        f()
        out[f"{precision} {fk} forward"] = f
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4096, 7168, device="cuda", generator=g).bfloat16()
    w = (torch.randn(4, 4096, 7168, device="cuda", generator=g) * 0.01).bfloat16()
    offsets = torch.tensor([0, 1024, 2048, 3072, 4096], dtype=torch.int32, device="cuda")
    a_codes, a_scales = ops.fp8_quantize_rows(a)
    w_codes, w_scales = ops.fp8_quantize_weight_blocks(w)
    out_fp8 = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
    out["fp8_grouped_gemm alone"] = lambda: ops.fp8_grouped_gemm(
        a_codes, a_scales, w_codes, w_scales, offsets, out_fp8)
    out["grouped_gemm (bf16 engine) alone"] = lambda: ops.grouped_gemm(a, w, offsets, out_fp8)
    out["torch matmul"] = lambda: a[:, :4096] @ a[:4096, :4096]
    # Milliseconds of cuBLAS work (12 x 0.24 TFLOP), the blockwise forward megakernel's order:
    # whether any long run of kernels, not only ours, leaves the next launch waiting.
    out["torch matmuls x12"] = lambda: [a @ a[:4096].t() for _ in range(12)]
    return out


def main():
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    runs = kernels()
    for setting in ("as is", "after bench_moe's preconditioning", "stack limit raised",
                    "lmem resize to max"):
        if setting == "after bench_moe's preconditioning":
            precondition()
        if setting == "stack limit raised":
            print("cuCtxSetLimit(STACK, 4096):",
                  cuda.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(4096)))
        if setting == "lmem resize to max":
            print("cuCtxSetFlags(flags | LMEM_RESIZE_TO_MAX):",
                  cuda.cuCtxSetFlags(ctypes.c_uint(ctx_flags() | CU_CTX_LMEM_RESIZE_TO_MAX)))
        print(f"{setting}: stack limit {stack_limit()} B, context flags {ctx_flags():#x}")
        for name, kernel in runs.items():
            first, second = next_launch_us(kernel)
            print(f"    after {name:34s}: next launch {first:7.1f} us, the one after {second:5.1f} us")


if __name__ == "__main__":
    main()
