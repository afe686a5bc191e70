"""Where a MoE layer's forward (the separate kernels, EP=1, autograd on as in training) spends
its GPU time, per kernel (torch.profiler), under bf16 and mxfp8 with the weights as codes and
as rounded bf16 values, on one model shape: what the MXFP8 forward adds beyond its GEMMs.

    python benchmarks/probes/profile_forward.py --model deepseek_v3_like --variant ep64 \
        --tokens 4096 --out benchmarks/results/<dir>/profile_forward.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks" / "diagnostics"))

from mok_megatron.config import KernelKnobs, Recipe, load_model  # noqa: E402
from mok_megatron.functional import moe_experts  # noqa: E402
from profile_backward import problem, profile_kernels  # noqa: E402

SETTINGS = {"bf16": ("bf16", "auto"), "mxfp8_codes": ("mxfp8", "codes"),
            "mxfp8_rounded": ("mxfp8", "rounded")}


def forward_kernels(inputs, recipe, iters: int) -> dict:
    """Mean GPU microseconds per forward of each kernel (by name), and of the whole forward
    between two events."""
    for _ in range(3):
        moe_experts(*inputs, recipe=recipe)
    wall, kernels = profile_kernels(lambda: None,
                                    lambda _: moe_experts(*inputs, recipe=recipe), iters)
    return {"forward_us": wall, "kernels_us": kernels}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek_v3_like")
    p.add_argument("--variant", default="ep64", choices=["full", "ep64"])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    model = load_model(args.model)
    spec = model if args.variant == "full" else model.ep64_equivalent(1)
    inputs, _ = problem(model, spec.num_experts, args.tokens)
    runs = {}
    for name, (precision, form) in SETTINGS.items():
        recipe = Recipe(name="profile", precision=precision, backend="cuda",
                        kernel=KernelKnobs(max_tokens_per_rank=args.tokens, mxfp8_weights=form))
        runs[name] = r = forward_kernels(inputs, recipe, args.iters)
        print(f"{args.model} {args.variant} E={spec.num_experts} T={args.tokens} {name}: "
              f"forward {r['forward_us']:.0f} us, kernels {sum(r['kernels_us'].values()):.0f} us")
        for k, v in list(r["kernels_us"].items())[:10]:
            print(f"    {v:9.1f} us  {k}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                        "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
