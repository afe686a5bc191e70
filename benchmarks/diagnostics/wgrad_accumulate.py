"""The expert weight gradients under gradient-accumulation fusion, two ways on the same
operands: ops.grouped_wgrad_accumulate (fp32 accumulators added into main_grad in place, the
separate backward's launch) against torch._grouped_mm's bf16 dW followed by the fp32 add DDP
does without the fusion (main_grad += dW). Both weight gradients of a layer (dW2 = dY^T act,
dW1 = dh^T x), uniform routing, EP=1.

    python benchmarks/diagnostics/wgrad_accumulate.py --models deepseek_v3_like \\
        qwen3_30b_a3b_like --tokens 4096
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from gpu_timing import mean_seconds  # noqa: E402
from mok_megatron.cuda import ops  # noqa: E402
from mok_megatron.config import load_model  # noqa: E402


def problem(hidden: int, ffn: int, experts: int, rows: int):
    """Operands [rows, .] grouped evenly over `experts`, and per-expert fp32 main_grads."""
    g = torch.Generator(device="cuda").manual_seed(0)
    per = rows // experts
    offsets = torch.arange(experts + 1, device="cuda", dtype=torch.int32) * per
    def rand(cols):
        return torch.randn(experts * per, cols, device="cuda", generator=g).bfloat16()
    dy, act, dh, x = rand(hidden), rand(ffn), rand(2 * ffn), rand(hidden)
    grads = {"w1": torch.zeros(experts, 2 * ffn, hidden, device="cuda"),
             "w2": torch.zeros(experts, hidden, ffn, device="cuda")}
    return offsets, (dy, act, dh, x), grads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["deepseek_v3_like", "qwen3_30b_a3b_like"])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--experts", type=int, default=8, help="local experts (EP64-equivalent)")
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, T={args.tokens}, {args.experts} local experts")
    for name in args.models:
        m = load_model(name)
        H, F, rows = m.hidden_size, m.moe_ffn_hidden_size, args.tokens * m.topk
        offsets, (dy, act, dh, x), grads = problem(H, F, args.experts, rows)
        addresses = {k: torch.tensor([t.data_ptr() for t in v], device="cuda")
                     for k, v in grads.items()}

        def fused():
            ops.grouped_wgrad_accumulate(dy, act, offsets, addresses["w2"])
            ops.grouped_wgrad_accumulate(dh, x, offsets, addresses["w1"])

        def unfused():
            grads["w2"].add_(torch._grouped_mm(dy.t(), act, offs=offsets[1:]))
            grads["w1"].add_(torch._grouped_mm(dh.t(), x, offs=offsets[1:]))

        def gemms_only():
            torch._grouped_mm(dy.t(), act, offs=offsets[1:])
            torch._grouped_mm(dh.t(), x, offs=offsets[1:])

        flops = 2 * rows * (H * F + 2 * F * H)
        t = {k: mean_seconds(f, iters=20, warmup=5)
             for k, f in (("fused", fused), ("unfused", unfused), ("bf16_gemms", gemms_only))}
        print(f"{name}: H={H} F={F} rows={rows}: fused {t['fused'] * 1e3:.3f} ms "
              f"({flops / t['fused'] / 1e12:.0f} TF/s), torch bf16 dW + fp32 add "
              f"{t['unfused'] * 1e3:.3f} ms, torch bf16 dW alone {t['bf16_gemms'] * 1e3:.3f} ms; "
              f"fused / unfused {t['fused'] / t['unfused']:.3f}")


if __name__ == "__main__":
    main()
