"""Where one MoE forward's time goes on one GPU (EP=1): every kernel of the mok forward
(functional.moe_experts, CUDA backend) with its GPU time, from torch.profiler, next to the
forward's wall time per call - the part the persistent kernel does not cover (schedule,
publish copies, barriers, reduction, launch gaps) is the difference.

    python benchmarks/diagnostics/trace_forward.py --model qwen3_30b_a3b_like --experts 8 --tokens 2048 \
        --forward-kernel megakernel --out trace.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

# Run from anywhere: the repository (mok_megatron); this folder holds the rest.
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from layer_problem import one_gpu_forward  # noqa: E402
from mok_megatron.config import load_model  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3_30b_a3b_like")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--forward-kernel", default="megakernel", choices=["separate", "megakernel"])
    ap.add_argument("--comm-sms", type=int, default=12)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    T = args.tokens
    forward = one_gpu_forward(load_model(args.model), args.experts, T, args.forward_kernel,
                              args.comm_sms)

    for _ in range(5):
        forward()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.iters):
        forward()
    stop.record()
    torch.cuda.synchronize()
    wall_ms = start.elapsed_time(stop) / args.iters

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            forward()
        torch.cuda.synchronize()
    per_kernel = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            entry = per_kernel[ev.name[:90]]
            entry[0] += ev.device_time_total / 1e3 / args.iters
            entry[1] += 1
    rows = sorted(((name, ms, n // args.iters) for name, (ms, n) in per_kernel.items()),
                  key=lambda r: -r[1])
    gpu_ms = sum(ms for _, ms, _ in rows)
    print(f"{args.model} E={args.experts} T={T} {args.forward_kernel}: forward "
          f"{wall_ms:.3f} ms per call, kernels {gpu_ms:.3f} ms "
          f"({sum(n for *_, n in rows)} launches)")
    for name, ms, n in rows:
        print(f"  {ms:8.3f} ms  x{n:<3} {name}")
    if args.out:
        args.out.write_text(json.dumps({
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "gpu": torch.cuda.get_device_name(), "forward_ms": wall_ms, "kernels_ms": gpu_ms,
            "kernels": [{"name": n, "ms": ms, "launches": c} for n, ms, c in rows]}, indent=1))


if __name__ == "__main__":
    main()
