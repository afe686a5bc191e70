"""Probe: the blockwise recipe's weight gradients, the two ways the repository has run them, on
the layer's shapes at EP=1 - (a) the operands rounded to 128 x 1 blocks along each expert's rows
in bf16 (ops.mx_round_segments) and torch._grouped_mm (session 16), (b) the operands quantized
and written transposed (ops.fp8_quantize_segments) and the FP8 wgrad kernel (session 17).
Prints each part's GPU time (CUDA events, median of `--iters`) and the GEMMs' TFLOP/s. Not
part of the package: bench_moe.py times the layer.

    python benchmarks/probes/blockwise_wgrad.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mok_megatron import ops  # noqa: E402

# name, hidden H, FFN F (FC1 rows 2F: gated), experts, tokens, top-k
SHAPES = [("deepseek ep64", 7168, 2048, 8, 4096, 8),
          ("deepseek full", 7168, 2048, 256, 4096, 8),
          ("qwen3 ep64", 2048, 768, 8, 4096, 8),
          ("qwen3 full", 2048, 768, 128, 4096, 8)]


def gpu_ms(fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(iters: int = 7) -> None:
    dev = torch.device("cuda")
    for name, H, F, E, T, K in SHAPES:
        g = torch.Generator(device=dev).manual_seed(0)
        ids = torch.rand(T, E, device=dev, generator=g).topk(K, dim=1).indices
        counts = torch.bincount(ids.flatten(), minlength=E)
        offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
        rows = T * K
        dout, x = (torch.randn(rows, H, device=dev, generator=g).bfloat16() for _ in range(2))
        act = torch.randn(rows, F, device=dev, generator=g).bfloat16()
        dh = torch.randn(rows, 2 * F, device=dev, generator=g).bfloat16()
        offs = offsets[1:]
        blocks = ops.segment_blocks(offsets)
        flops = 2 * rows * (H * F + 2 * F * H)
        operands = (dout, act, dh, x)

        def round_all():
            return [ops.mx_round_segments(t, offsets, block=ops.FP8_BLOCK) for t in operands]

        rounded = round_all()

        def grouped_mm():
            torch._grouped_mm(rounded[0].t(), rounded[1], offs=offs)
            torch._grouped_mm(rounded[2].t(), rounded[3], offs=offs)

        def quantize_all():
            return [ops.fp8_quantize_segments(a, offsets, blocks) for a in (dh, dout)] + \
                   [ops.fp8_quantize_segments(b, offsets, blocks, column_scales=True)
                    for b in (x, act)]

        q = quantize_all()

        def fp8_wgrad():
            ops.fp8_wgrad(*q[0], *q[2], blocks)
            ops.fp8_wgrad(*q[1], *q[3], blocks)

        t = {part: gpu_ms(fn, iters) for part, fn in (
            ("round", round_all), ("grouped_mm", grouped_mm), ("quantize", quantize_all),
            ("fp8_wgrad", fp8_wgrad))}
        old, new = t["round"] + t["grouped_mm"], t["quantize"] + t["fp8_wgrad"]
        print(f"{name:14s} E={E:3d} T={T} rows {rows}: (a) round {t['round']:.3f} + "
              f"grouped_mm {t['grouped_mm']:.3f} ({flops / t['grouped_mm'] / 1e9:.0f} TF/s) = "
              f"{old:.3f} ms | (b) quantize {t['quantize']:.3f} + fp8_wgrad "
              f"{t['fp8_wgrad']:.3f} ({flops / t['fp8_wgrad'] / 1e9:.0f} TF/s) = {new:.3f} ms "
              f"| b/a {new / old:.2f}", flush=True)


if __name__ == "__main__":
    main()
