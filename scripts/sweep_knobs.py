"""Find megakernel knobs for one shape and GPU count, and write them into a recipe YAML.

Times the forward megakernel (and v1's separate kernels, for reference) over the given
row-pulling block counts (kernel.comm_sms_forward), minibatch sizes (kernel.minibatch_tokens)
and, with --macrobatch-tokens, macrobatch sizes of its ring (kernel.macrobatch_tokens, with
backward_inputs: recomputed) on one model shape, in one torchrun group, checks every setting
gives bit-identical outputs, and writes the fastest as a recipe: the base recipe's file with
`forward_kernel: megakernel` and the chosen knob values substituted. With
--comm-sms-backward it then times forward + backward of both megakernels at the chosen forward
knobs over those dY-pulling block counts (kernel.comm_sms_backward) and, with
--macrobatch-tokens, the macrobatch sizes again (the backward megakernel walks a ring of the
same macrobatches), checks the gradients are bit-identical, and writes `backward_kernel:
megakernel` with the fastest count - and the macrobatch size fwd+bwd chose.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    torchrun --nproc-per-node 2 scripts/sweep_knobs.py --model deepseek_v3_like \
        --tokens 4096 --out configs/recipes/bf16_dsv3_ep2.yaml

schedule_capacity is written back unchanged: it bounds memory, not time (the routing's
imbalance decides how low it can go).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_moe import make_problem, mok_path, timed  # noqa: E402
from mok_megatron.config import CONFIG_DIR, load_model  # noqa: E402


def problem(args):
    """The sweep's one problem (make_problem's x, ids, probs, w1, w2, dy), for both sweeps."""
    model = load_model(args.model)
    world = dist.get_world_size()
    spec = model if args.variant == "full" else model.ep64_equivalent(world)
    return make_problem(model, spec.num_experts, args.tokens, args.seed)


def sweep(args, tensors) -> dict:
    x, ids, probs, w1, w2, _ = tensors
    group = dist.group.WORLD
    results, reference = {}, None
    rings = args.macrobatch_tokens or [None]
    candidates = [("separate", 16, None, None)] + [
        ("megakernel", c, m, b) for c in args.comm_sms for m in rings
        for b in args.minibatch_tokens]
    for kind, comm, ring, mini in candidates:
        knobs = {} if ring is None else {"backward_inputs": "recomputed",
                                          "macrobatch_tokens": ring}
        if mini is not None:
            knobs["minibatch_tokens"] = mini
        fn = mok_path(group, args.tokens, kind, comm, **knobs)
        with torch.no_grad():
            y = fn(x, ids, probs, w1, w2)
        if kind == "megakernel":
            if reference is None:
                reference = y.clone()
            elif not torch.equal(reference, y):
                raise RuntimeError(f"comm_sms_forward={comm}, macrobatch_tokens={ring}, "
                                   f"minibatch_tokens={mini} changed the output bits")

        def fwd():
            with torch.no_grad():
                fn(x, ids, probs, w1, w2)

        results[f"{kind}:{comm}:{ring}:{mini}"] = timed(fwd, args.iters, args.warmup)
    return results


def sweep_backward(args, tensors, comm: int, mini: int) -> dict:
    """fwd+bwd of both megakernels at the chosen forward knobs, per comm_sms_backward and, with
    --macrobatch-tokens, per macrobatch size again: the backward megakernel walks its own ring
    of the same macrobatches, and its time outweighs forward's."""
    x, ids, probs, w1, w2, dy = tensors
    leaves = [x.requires_grad_(), probs.requires_grad_(), w1, w2]
    results, reference = {}, None
    for ring in args.macrobatch_tokens or [None]:
        knobs = {"minibatch_tokens": mini}
        if ring is not None:
            knobs.update(backward_inputs="recomputed", macrobatch_tokens=ring)
        for comm_bwd in args.comm_sms_backward:
            fn = mok_path(dist.group.WORLD, args.tokens, "megakernel", comm, **knobs,
                          backward_kernel="megakernel", comm_sms_backward=comm_bwd)

            def both():
                for t in leaves:
                    t.grad = None
                fn(x, ids, probs, w1, w2).backward(dy)

            both()
            grads = [t.grad.clone() for t in leaves]
            if reference is None:
                reference = grads
            elif not all(torch.equal(a, b) for a, b in zip(reference, grads)):
                raise RuntimeError(f"comm_sms_backward={comm_bwd}, macrobatch_tokens={ring} "
                                   f"changed the gradient bits")
            results[f"megakernel_backward:{comm_bwd}:{ring}"] = timed(both, args.iters,
                                                                      args.warmup)
    return results


def write_recipe(base: Path, out: Path, comm_sms: int,
                 macrobatch_tokens: Optional[int] = None,
                 minibatch_tokens: Optional[int] = None,
                 comm_sms_backward: Optional[int] = None) -> None:
    """`macrobatch_tokens`: also switch on the ring (backward_inputs: recomputed);
    `comm_sms_backward`: also the backward megakernel."""
    text = base.read_text()
    knobs = [("forward_kernel", "megakernel"), ("comm_sms_forward", str(comm_sms))]
    if minibatch_tokens is not None:
        knobs.append(("minibatch_tokens", str(minibatch_tokens)))
    if comm_sms_backward is not None:
        knobs += [("backward_kernel", "megakernel"), ("comm_sms_backward", str(comm_sms_backward))]
    if macrobatch_tokens is not None:
        knobs += [("backward_inputs", "recomputed"), ("macrobatch_tokens", str(macrobatch_tokens))]
    for key, value in knobs:
        # Keep the value's column: the old value and its padding become the new value,
        # padded to the same width (the comments stay aligned).
        def put(m, value=value):
            old = m.group(2)
            pad = " " * max(len(old) - len(value), 1) if old.endswith(" ") else ""
            return m.group(1) + value + pad
        text, n = re.subn(rf"^([ \t]*{key}:[ \t]*)(\S+[ \t]*)", put, text, flags=re.M)
        if n != 1:
            raise ValueError(f"{base}: expected one `{key}:` line, found {n}")
    out.write_text(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--variant", choices=["full", "ep64"], default="full")
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--comm-sms", type=int, nargs="+", default=[4, 8, 16, 24, 32])
    p.add_argument("--minibatch-tokens", type=int, nargs="+", default=[128],
                   help="minibatch sizes to try (kernel.minibatch_tokens)")
    p.add_argument("--macrobatch-tokens", type=int, nargs="+", default=None,
                   help="also sweep the ring's macrobatch size (backward_inputs: recomputed)")
    p.add_argument("--comm-sms-backward", type=int, nargs="+", default=None,
                   help="also sweep the backward megakernel's dY-pulling blocks "
                        "(kernel.comm_sms_backward)")
    p.add_argument("--base-recipe", default="bf16")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="recipe YAML to write")
    args = p.parse_args(argv)

    torch.cuda.set_device(int(__import__("os").environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    tensors = problem(args)
    results = sweep(args, tensors)
    mega = {k: v for k, v in results.items() if k.startswith("megakernel:")}
    best = min(mega, key=mega.get)
    _, comm, ring, mini = best.split(":")
    ring = None if ring == "None" else int(ring)
    backward, best_backward, comm_bwd = {}, None, None
    if args.comm_sms_backward:
        backward = sweep_backward(args, tensors, int(comm), int(mini))
        best_backward = min(backward, key=backward.get)
        _, comm_bwd, ring_bwd = best_backward.split(":")
        comm_bwd, ring = int(comm_bwd), None if ring_bwd == "None" else int(ring_bwd)
    if dist.get_rank() == 0:
        write_recipe(CONFIG_DIR / "recipes" / f"{args.base_recipe}.yaml", args.out, int(comm),
                     ring, int(mini), comm_bwd)
        print(json.dumps({"model": args.model, "variant": args.variant, "tokens": args.tokens,
                          "world": dist.get_world_size(), "fwd_s": results, "best": best,
                          "both_s": backward, "best_backward": best_backward,
                          "recipe": str(args.out)}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
