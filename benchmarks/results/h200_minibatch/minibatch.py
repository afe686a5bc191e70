"""Megakernel time vs the pull's publish unit (minibatch_rows), EP=1. Run from the repository
root: python3 benchmarks/results/h200_minibatch/minibatch.py"""
import sys

sys.path.insert(0, "scripts")
from gpu_timing import median_ms  # noqa: E402
from profile_megakernel import build, load_model, megakernel, per_gpu_experts  # noqa: E402

for name in ("qwen3_30b_a3b_like", "deepseek_v3_like"):
    model = load_model(name)
    for variant in ("ep64", "full"):
        E = per_gpu_experts(model, variant, 1)
        p = build(model, E, 4096, 0)
        res = {(comm, mb): median_ms(megakernel(p, comm, minibatch_rows=mb), 7, 3)
               for comm in (12, 16) for mb in (128, 512, 2048)}
        print(name[:4], variant, E, " ".join(f"c{c}/mb{m}={v:.3f}" for (c, m), v in res.items()),
              flush=True)
