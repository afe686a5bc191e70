"""What the first MoE layer call of a process costs, against the calls after it (one GPU, EP=1).

The bounded waits' default (kernel.spin_timeout_ms) must outlast the largest healthy skew
between ranks reaching one barrier. A first call does work the later ones skip - the
workspace's allocation, loading the kernels' modules on first launch (CUDA lazy loading),
cuBLAS set-up for the grouped GEMMs - so a rank making its first call while its peers already
wait is the common source of skew. Each setting runs in a fresh process:

    python benchmarks/diagnostics/first_call_cost.py --out first_call.json [--model qwen3_30b_a3b_like]

prints and writes, per forward kernel, the first forward + backward's wall time (host,
synchronized), the median of the next ones, and their difference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

_CHILD = """
import json, sys, time
import torch
from mok_megatron.config import KernelKnobs, Recipe, load_model
from mok_megatron.functional import moe_experts

model, kernel, tokens, experts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m = load_model(model)
H, F, K = m.hidden_size, m.moe_ffn_hidden_size, m.topk
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(tokens, H, device="cuda", generator=g).bfloat16().requires_grad_()
ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(K, dim=1).indices
probs = torch.rand(tokens, K, device="cuda", generator=g).requires_grad_()
w1 = (torch.randn(experts, 2 * F, H, device="cuda", generator=g) * H**-0.5).bfloat16()
w2 = (torch.randn(experts, H, F, device="cuda", generator=g) * F**-0.5).bfloat16()
w1.requires_grad_(); w2.requires_grad_()
dy = torch.randn(tokens, H, device="cuda", generator=g).bfloat16()
recipe = Recipe(name="first_call", backend="cuda",
                kernel=KernelKnobs(max_tokens_per_rank=tokens, forward_kernel=kernel))
torch.cuda.synchronize()

def step():
    start = time.perf_counter()
    y = moe_experts(x, ids, probs, w1, w2, activation="swiglu", recipe=recipe)
    y.backward(dy)
    torch.cuda.synchronize()
    return time.perf_counter() - start

first = step()
rest = sorted(step() for _ in range(10))
print(json.dumps({"first_s": first, "steady_s": rest[len(rest) // 2]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_30b_a3b_like")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--experts", type=int, default=None,
                        help="local experts (default: all of the model's: EP=1)")
    parser.add_argument("--out", required=True)
    opts = parser.parse_args()
    from mok_megatron.config import load_model

    experts = opts.experts or load_model(opts.model).num_experts
    results = {"model": opts.model, "tokens": opts.tokens, "experts": experts,
               "date": time.strftime("%Y-%m-%d")}
    for kernel in ("separate", "megakernel"):
        proc = subprocess.run([sys.executable, "-c", _CHILD, opts.model, kernel,
                               str(opts.tokens), str(experts)],
                              capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["first_minus_steady_s"] = r["first_s"] - r["steady_s"]
        results[kernel] = r
        print(f"{kernel:10s} first {r['first_s'] * 1e3:9.1f} ms   steady "
              f"{r['steady_s'] * 1e3:7.2f} ms   first call costs "
              f"{r['first_minus_steady_s'] * 1e3:8.1f} ms more", flush=True)
    with open(opts.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
