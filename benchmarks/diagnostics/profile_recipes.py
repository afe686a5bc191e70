"""Where a MoE layer's time goes under each precision recipe at EP=1: the GPU time of every
kernel of one training forward (autograd on) and of its backward (torch.profiler), next to each
call's wall time between two events, for bf16 and fp8_blockwise on the separate kernels and on
the forward megakernel - which kernels the recipe adds, and what its GEMMs save.

    python benchmarks/diagnostics/profile_recipes.py --model qwen3_30b_a3b_like --variant ep64 \
        --out profile.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from profile_backward import (  # also puts the repository on the path
    print_kernels, profile_kernels, variant_problem, write_runs)

from mok_megatron.config import KernelKnobs, Recipe
from mok_megatron.functional import moe_experts

SETTINGS = {"bf16 separate": ("bf16", "separate"),
            "bf16 megakernel": ("bf16", "megakernel"),
            "fp8_blockwise separate": ("fp8_blockwise", "separate"),
            "fp8_blockwise megakernel": ("fp8_blockwise", "megakernel")}


def training_forward(inputs, precision: str, forward_kernel: str, tokens: int):
    """The layer's training forward (autograd on, the leaves' gradients cleared first) under
    one setting; backward_inputs keeps its default, recomputed: the FP8 recipes' megakernel
    takes no other."""
    recipe = Recipe(name="profile", precision=precision, backend="cuda",
                    kernel=KernelKnobs(max_tokens_per_rank=tokens, forward_kernel=forward_kernel))
    leaves = [t for t in inputs if t.requires_grad]

    def forward(_=None):
        for t in leaves:
            t.grad = None
        return moe_experts(*inputs, recipe=recipe)

    return forward


def profile_setting(inputs, dy, precision: str, forward_kernel: str, tokens: int,
                    iters: int) -> dict:
    forward = training_forward(inputs, precision, forward_kernel, tokens)
    for _ in range(3):  # warm-up: workspaces, and the quantized weights' cache
        forward().backward(dy)
    fwd_us, fwd_kernels = profile_kernels(lambda: None, forward, iters)
    bwd_us, bwd_kernels = profile_kernels(forward, lambda y: y.backward(dy), iters)
    return {"forward_us": fwd_us, "forward_kernels_us": fwd_kernels,
            "backward_us": bwd_us, "backward_kernels_us": bwd_kernels}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3_30b_a3b_like")
    p.add_argument("--variant", default="ep64", choices=["full", "ep64"])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    spec, inputs, dy = variant_problem(args)
    runs = {}
    for name in args.settings:
        r = runs[name] = profile_setting(inputs, dy, *SETTINGS[name], args.tokens, args.iters)
        for phase in ("forward", "backward"):
            kernels = r[f"{phase}_kernels_us"]
            print(f"{args.model} {args.variant} E={spec.num_experts} T={args.tokens} {name}: "
                  f"{phase} {r[f'{phase}_us']:.0f} us, kernels {sum(kernels.values()):.0f} us")
            print_kernels(kernels, args.top)
    write_runs(args, runs)


if __name__ == "__main__":
    main()
