"""The main job: run the MoE layer across an expert-parallel group, forward and backward, and
show that it agrees with an independent float64 per-token computation.

    python -m mok_megatron.demo [--model tiny] [--recipe bf16] [--backend auto] ...

Without a GPU it spawns EP=2 over gloo on CPU tensors, where ``functional.moe_experts`` runs
the reference backend. With CUDA GPUs it spawns one process per GPU (up to 4) over NCCL on
GPU tensors, where ``auto`` picks the CUDA kernels. Routing is Zipf-skewed by default; token
counts differ between ranks. The shared expert is left out: Megatron computes it outside the
fused call. Prints the rel-L2 error of y, dx, dprobs, dw1 and dw2 and PASS or FAIL; the exit
status is non-zero on FAIL.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from typing import Optional, Sequence

import torch

from .config import FP8_PRECISIONS, Recipe, load_model, load_recipe
from .functional import moe_experts, resolve_backend
from .testing import ROUTINGS, ProblemSpec, compare, concat_ranks, run_layer, run_ranks

MAX_GPUS = 4
FP8_TOLERANCE = 0.1  # the FP8 recipes' bound: sum|d| / sum|ref| against the BF16 reference


def _run_rank(rank, world_size, group, spec: ProblemSpec, recipe: Recipe, device_type: str):
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    layer = functools.partial(moe_experts, group=group, activation=spec.activation,
                              recipe=recipe)
    return run_layer(layer, spec.build().local(rank, device))


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mok_megatron.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="model config (configs/models)")
    parser.add_argument("--recipe", default="bf16", help="precision recipe (configs/recipes)")
    parser.add_argument("--backend", choices=("auto", "cuda", "reference"),
                        help="override the recipe's backend")
    parser.add_argument("--world-size", type=int,
                        help=f"EP ranks (default: 2 on CPU, one per GPU up to {MAX_GPUS})")
    parser.add_argument("--tokens", type=int,
                        help="tokens on rank 0, fewer on later ranks (default: the model's "
                             "largest bench.tokens_per_gpu)")
    parser.add_argument("--routing", choices=ROUTINGS, default="zipf")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse(argv)
    model = load_model(args.model)
    recipe = load_recipe(args.recipe)
    if args.backend:
        recipe = dataclasses.replace(recipe, backend=args.backend)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device_type = "cuda" if gpus else "cpu"
    world = args.world_size or (min(gpus, MAX_GPUS) if gpus else 2)
    if gpus and world > gpus:
        raise SystemExit(f"--world-size {world} needs {world} GPUs; this machine has {gpus}")
    if model.num_experts % world:
        raise SystemExit(f"{model.num_experts} experts do not split over {world} ranks")
    tokens = args.tokens or max(model.bench.tokens_per_gpu)
    spec = ProblemSpec(
        name="demo",
        # Ragged on purpose: rank r has 1/(2W) fewer tokens than rank r-1.
        tokens_per_rank=tuple(tokens - r * tokens // (2 * world) for r in range(world)),
        num_experts=model.num_experts,
        hidden=model.hidden_size,
        ffn=model.moe_ffn_hidden_size,
        topk=model.topk,
        activation=model.activation,
        routing=args.routing,
        dtype=torch.bfloat16,
        probs_dtype=torch.float32,
        seed=args.seed,
    )
    backend = resolve_backend(recipe, torch.device(device_type))
    problem = spec.build()
    slots_per_expert = torch.bincount(problem.ids[problem.ids >= 0], minlength=spec.num_experts)

    print("mok_megatron demo: the MoE layer vs an independent float64 per-token loop")
    print(f"  EP={world} over {'nccl, one GPU per rank' if gpus else 'gloo on CPU'}; "
          f"functional.moe_experts backend: {backend} (recipe {recipe.name})")
    print(f"  model {model.name}: H={spec.hidden}, F={spec.ffn}, {spec.num_experts} experts "
          f"({spec.num_experts // world} per rank), top-{spec.topk}, {spec.activation}; "
          f"bf16 x and weights, fp32 probs; {recipe.precision} experts")
    print(f"  tokens per rank {list(spec.tokens_per_rank)}; {args.routing} routing, "
          f"slots per expert {slots_per_expert.tolist()}")
    per_rank = run_ranks(_run_rank, world, spec, recipe, device_type,
                         backend="nccl" if gpus else "gloo")
    outputs, oracle = concat_ranks(per_rank), problem.oracle()
    if recipe.precision in FP8_PRECISIONS:
        # The FP8 recipes round every GEMM operand to 3 mantissa bits: measured as the issue's
        # sum|d| / sum|ref| against the unquantized float64 loop.
        errors = {n: float((outputs[n].double() - oracle[n].double()).abs().sum()
                           / oracle[n].double().abs().sum()) for n in oracle}
        metric, tolerance = "sum|d|/sum|ref|", FP8_TOLERANCE
    else:
        errors = compare(outputs, oracle)
        metric, tolerance = "rel-L2 error", spec.tolerance

    print(f"  {metric} vs the float64 loop, forward and backward "
          f"(tolerance {tolerance:.0e}):")
    for name, error in errors.items():
        print(f"    {name:<7}{error:9.2e}  {'ok' if error <= tolerance else 'FAIL'}")
    passed = all(error <= tolerance for error in errors.values())
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
