"""CUDA-event timing shared by the benchmark and probe scripts."""

from __future__ import annotations

from typing import Callable, Optional

import torch


def mean_seconds(fn: Callable, iters: int = 10, warmup: int = 3) -> float:
    """Mean time of `fn` over `iters` back-to-back calls (one event pair around the loop)."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3


def median_ms(fn: Callable, iters: int, warmup: int) -> float:
    """Median of per-call times (per_call_seconds), milliseconds, after precondition()."""
    precondition()
    times = sorted(per_call_seconds(fn, iters, warmup))
    return times[len(times) // 2] * 1e3


def per_call_seconds(fn: Callable, iters: int, warmup: int,
                     before_each: Optional[Callable] = None) -> list[float]:
    """Each call timed alone (synchronized after it); `before_each` runs outside the timing
    (e.g. a barrier so every rank starts together)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if before_each is not None:
            before_each()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


_HEAT = []  # the matmul operands of precondition(), allocated once


def precondition(seconds: float = 0.3) -> None:
    """Dense bf16 matmuls for about `seconds` before a path is timed, so every path starts
    from the clock and power state sustained tensor-core work leaves (training's): timed right
    after lighter work (a weight quantization loop), a compute-bound path ran up to 10% faster
    than after a heavy one (docs/perf-log.md, MXFP8 on the forward megakernel, 2026-12-04) - the paths' order in a run was
    deciding their ratios."""
    if not _HEAT:
        _HEAT.extend(torch.randn(2, 8192, 8192, device="cuda", dtype=torch.bfloat16).unbind(0))
    a, b = _HEAT
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    a @ b
    end.record()
    torch.cuda.synchronize()
    for _ in range(max(1, int(seconds / (start.elapsed_time(end) / 1e3)))):
        a @ b
    torch.cuda.synchronize()
