"""Where a MoE layer's backward spends its GPU time at EP=1: per kernel (torch.profiler), for
the separate backward and the backward megakernel at several numbers of dY-pulling blocks
(kernel.comm_sms_backward), on one model shape; under an FP8 recipe (--precision) the
separate kernels only (the megakernels run BF16). Forward runs outside the profile. The
separate backward runs after each forward of --forward-kernel: after the forward megakernel
it recomputes FC1 on our tile engine (the megakernel's bits), after the separate forward on
torch's grouped GEMM, so the two tables show what that recompute costs.

    python benchmarks/diagnostics/profile_backward.py --model qwen3_30b_a3b_like --variant full --tokens 4096 \
        --comm-sms-backward 4 8 16 32
    python benchmarks/diagnostics/profile_backward.py --model deepseek_v3_like --variant ep64 --precision fp8_blockwise
    python benchmarks/diagnostics/profile_backward.py --model mixtral_8x7b_like --variant full \
        --forward-kernel megakernel separate --comm-sms-backward
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

# Run from anywhere: the repository (mok_megatron); this folder holds the rest.
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mok_megatron.config import KernelKnobs, Recipe, load_model  # noqa: E402
from mok_megatron.functional import moe_experts  # noqa: E402


def problem(model, experts: int, tokens: int):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    x = torch.randn(tokens, H, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    ids = torch.rand(tokens, experts, device=dev, generator=g).topk(K, dim=1).indices
    probs = torch.softmax(torch.randn(tokens, K, device=dev, generator=g), 1).requires_grad_()
    w1 = (torch.randn(experts, 2 * F, H, device=dev, dtype=torch.bfloat16, generator=g)
          * H**-0.5).requires_grad_()
    w2 = (torch.randn(experts, H, F, device=dev, dtype=torch.bfloat16, generator=g)
          * F**-0.5).requires_grad_()
    dy = torch.randn(tokens, H, device=dev, dtype=torch.bfloat16, generator=g)
    return (x, ids, probs, w1, w2), dy


def variant_problem(args):
    """(the layer's expert spec, inputs, dy) for args.model at args.variant (full, or its
    EP64-equivalent on one GPU) and args.tokens."""
    model = load_model(args.model)
    spec = model if args.variant == "full" else model.ep64_equivalent(1)
    return (spec, *problem(model, spec.num_experts, args.tokens))


def profile_kernels(prepare, run, iters: int) -> tuple[float, dict[str, float]]:
    """Mean GPU microseconds per call of run(prepare()) - prepare outside the profile - of the
    whole call between two events, and of each kernel (by name), slowest first."""
    totals: dict[str, float] = defaultdict(float)
    wall = 0.0
    for _ in range(iters):
        arg = prepare()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            start.record()
            run(arg)
            end.record()
            torch.cuda.synchronize()
        wall += start.elapsed_time(end) * 1e3
        for e in prof.key_averages():
            if e.device_time_total > 0:
                totals[e.key[:90]] += e.device_time_total
    return wall / iters, {k: v / iters for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def print_kernels(kernels: dict[str, float], top: int) -> None:
    """The `top` slowest kernels of profile_kernels' table, a line each."""
    for k, v in list(kernels.items())[:top]:
        print(f"    {v:9.1f} us  {k}")


def write_runs(args, runs: dict) -> None:
    """The runs as JSON with the command's arguments, to args.out when it is given."""
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                        "runs": runs}, indent=1))


def backward_kernels(inputs, dy, recipe, iters: int) -> dict:
    """Mean GPU microseconds per backward of each kernel (by name), and of the whole
    backward between two events."""
    leaves = [t for t in inputs if t.requires_grad]

    def fresh():
        for t in leaves:
            t.grad = None
        return moe_experts(*inputs, recipe=recipe)

    for _ in range(3):
        fresh().backward(dy)
    wall, kernels = profile_kernels(fresh, lambda y: y.backward(dy), iters)
    return {"backward_us": wall, "kernels_us": kernels}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3_30b_a3b_like")
    p.add_argument("--variant", default="full", choices=["full", "ep64"])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--comm-sms-backward", type=int, nargs="*", default=[16],
                   help="the backward megakernel's pulling blocks, one run each (none: no run)")
    p.add_argument("--forward-kernel", nargs="+", default=["megakernel"],
                   choices=["megakernel", "separate"],
                   help="BF16: the forwards the separate backward runs after")
    p.add_argument("--precision", default="bf16", choices=["bf16", "mxfp8", "fp8_blockwise"])
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    spec, inputs, dy = variant_problem(args)
    runs = {}
    bf16 = args.precision == "bf16"
    forwards = args.forward_kernel if bf16 else ["separate"]
    settings = [(f"separate after the {f} forward" if len(forwards) > 1 else "separate",
                 {"forward_kernel": f}) for f in forwards] + [
        (f"megakernel comm_sms_backward={c}",
         {"forward_kernel": "megakernel", "backward_kernel": "megakernel",
          "comm_sms_backward": c})
        for c in (args.comm_sms_backward if bf16 else [])]
    for name, knobs in settings:
        recipe = Recipe(name="profile", precision=args.precision, backend="cuda",
                        kernel=KernelKnobs(max_tokens_per_rank=args.tokens,
                                           comm_sms_forward=12, **knobs))
        runs[name] = backward_kernels(inputs, dy, recipe, args.iters)
        r = runs[name]
        print(f"{args.model} {args.variant} E={spec.num_experts} T={args.tokens} "
              f"{args.precision} {name}: "
              f"backward {r['backward_us']:.0f} us")
        print_kernels(r["kernels_us"], 12)
    write_runs(args, runs)


if __name__ == "__main__":
    main()
