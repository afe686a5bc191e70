"""Train the same tiny GPT-MoE for a few steps under several dispatchers (default: ``mok`` and
``alltoall``) or recipes, from the same seed on the same GPUs, and compare their loss curves.

    python scripts/train_compare.py --nproc 2            # EP=2 on 2 GPUs, 20 steps
    python scripts/train_compare.py --nproc 2 --backend reference --out results/
    python scripts/train_compare.py --nproc 1 --steps 100 --dispatchers mok \
        --recipe bf16 mxfp8 --rtol 0.02                  # mok's MXFP8 against its BF16

Each run is ``torchrun --nproc-per-node N scripts/pretrain_mok_gpt.py ...`` with the Megatron
flags that configs/ gives for the model, the recipe and the dispatcher (as
``python -m mok_megatron.config`` prints them), EP = N, and the flags a wheel-only Megatron
needs. The script prints both curves and the largest relative difference between them, writes
each run's log and a summary JSON under --out, and exits 1 if the difference exceeds --rtol.
``--backend`` overrides the recipe's backend (e.g. ``reference`` while the CUDA kernels are not
built).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mok_megatron.config import (  # noqa: E402
    CONFIG_DIR,
    load_dispatcher,
    load_model,
    load_recipe,
    recipe_megatron_args,
    resolve_megatron_args,
)

# NVLink multicast must stay off on shared machines (a program that uses it can take the
# host's GPUs out of service).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}

# Megatron-Core wheel without Transformer Engine or Apex: see scripts/pretrain_mok_gpt.py.
WHEEL_FLAGS = ["--transformer-impl", "local", "--no-persist-layer-norm",
               "--no-masked-softmax-fusion", "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion",
               "--no-gradient-accumulation-fusion"]

ITERATION_LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*? lm loss: ([0-9.eE+-]+) \|")
# Megatron's per-iteration log: its time and the batch it took (training.py training_log).
ITERATION_TIME = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*? elapsed time per iteration \(ms\): "
                            r"([0-9.]+) \|.*? global batch size:\s*(\d+) \|")
# Iterations left out of the throughput: the first ones compile, allocate and warm up.
WARMUP_ITERATIONS = 3

# Launcher variables of an enclosing torchrun, which would confuse the one started here.
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
                  "MASTER_PORT")


def launcher_env() -> dict:
    """This process's environment for a torchrun started from it (also from inside a torchrun
    worker: its launcher's variables left out), multicast off, the repository importable."""
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER_VARS and not k.startswith("TORCHELASTIC_")}
    env.update(SAFE_ENV, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                  env.get("PYTHONPATH")])))
    return env


def tokens_per_second(log: str, seq_length: int) -> float:
    """Median training throughput of a Megatron log (tokens per second, all GPUs): global
    batch x seq_length over each logged iteration's time, the first WARMUP_ITERATIONS left out
    (all of them when that leaves none). NaN for a log without iteration times."""
    rates = [int(batch) * seq_length / (float(ms) / 1e3)
             for it, ms, batch in ITERATION_TIME.findall(log)
             if int(it) > WARMUP_ITERATIONS and float(ms) > 0]
    if not rates:
        rates = [int(batch) * seq_length / (float(ms) / 1e3)
                 for _, ms, batch in ITERATION_TIME.findall(log) if float(ms) > 0]
    return statistics.median(rates) if rates else float("nan")


def training_args(steps: int, nproc: int, seed: int) -> list[str]:
    return [
        "--expert-model-parallel-size", str(nproc),
        "--micro-batch-size", "4", "--global-batch-size", str(4 * nproc),
        "--train-iters", str(steps), "--eval-iters", "0", "--eval-interval", str(steps + 1),
        "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
        "--lr-warmup-iters", "2", "--weight-decay", "0.01", "--clip-grad", "1.0",
        "--seed", str(seed), "--mock-data", "--vocab-size", "1024", "--split", "100,0,0",
        "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2",
        "--moe-router-dtype", "fp32", "--log-interval", "1",
    ]


def recipe_with_backend(recipe: str, backend: Optional[str], out: Path) -> str:
    """The recipe name or path to run: `recipe` itself, or a copy with another backend."""
    if backend is None or load_recipe(recipe).backend == backend:
        return recipe
    source = Path(recipe) if Path(recipe).suffix else CONFIG_DIR / "recipes" / f"{recipe}.yaml"
    data = yaml.safe_load(source.read_text())
    data["backend"] = backend
    derived = out / f"recipe_{source.stem}_{backend}.yaml"
    derived.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(derived.resolve())


def run(dispatcher: str, opts, recipe: str, name: str) -> tuple[list[float], float]:
    """-> (the loss at every step, tokens per second)."""
    load_dispatcher(dispatcher).check_available()
    # WHEEL_FLAGS run Megatron's local layers, without Transformer Engine: the recipe's flags
    # for a run without it, wherever TE is installed.
    loaded = load_recipe(recipe)
    print(f"[{name}] {recipe_megatron_args(loaded, have_te=False)[1]}", flush=True)
    args = resolve_megatron_args(loaded, load_dispatcher(dispatcher), load_model(opts.model),
                                 have_te=False)
    args += training_args(opts.steps, opts.nproc, opts.seed) + WHEEL_FLAGS
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(opts.nproc),
               str(REPO / "scripts" / "pretrain_mok_gpt.py"), *args]
    env = launcher_env()
    log = opts.out / f"train_{name.replace('/', '_')}.log"
    print(f"[{name}] {' '.join(command)}\n[{name}] log: {log}", flush=True)
    with open(log, "w") as f:
        proc = subprocess.run(command, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    text = log.read_text()
    losses = {int(i): float(v) for i, v in ITERATION_LOSS.findall(text)}
    if proc.returncode != 0 or len(losses) != opts.steps:
        sys.stdout.write(text[-4000:])
        raise SystemExit(f"[{name}] training failed (exit {proc.returncode}, "
                         f"{len(losses)}/{opts.steps} steps logged); see {log}")
    return ([losses[i] for i in sorted(losses)],
            tokens_per_second(text, load_model(opts.model).seq_length))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2, help="GPUs, and the EP size")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--model", default="tiny", help="configs/models name or YAML path")
    parser.add_argument("--recipe", nargs="+", default=["bf16"],
                        help="configs/recipes names or YAML paths (each dispatcher runs each)")
    parser.add_argument("--backend", choices=["auto", "cuda", "reference"],
                        help="override the recipe's backend")
    parser.add_argument("--dispatchers", nargs="+", default=["mok", "alltoall"],
                        help="configs/dispatchers names; the first is compared to the others")
    parser.add_argument("--rtol", type=float, default=1e-2,
                        help="largest accepted relative loss difference (bf16 noise)")
    parser.add_argument("--out", type=Path, default=Path("train_compare_out"))
    opts = parser.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    recipes = {r: recipe_with_backend(r, opts.backend, opts.out) for r in opts.recipe}
    # One run per (dispatcher, recipe), named "dispatcher/recipe" when several recipes run.
    runs = {(f"{d}/{r}" if len(recipes) > 1 else d): (d, path)
            for r, path in recipes.items() for d in opts.dispatchers}
    results = {name: run(d, opts, path, name) for name, (d, path) in runs.items()}
    curves = {name: curve for name, (curve, _) in results.items()}
    throughput = {name: rate for name, (_, rate) in results.items()}
    first, *others = runs
    print(f"{'step':>4} " + " ".join(f"{n:>14}" for n in runs))
    for step in range(opts.steps):
        print(f"{step + 1:>4} " + " ".join(f"{curves[n][step]:14.6f}" for n in runs))
    worst = {n: max(abs(a - b) / abs(b) for a, b in zip(curves[first], curves[n]))
             for n in others}
    for n, diff in worst.items():
        print(f"max relative loss difference {first} vs {n}: {diff:.3e} (rtol {opts.rtol:g})")
    print("tokens/s (median after the first iterations): " + ", ".join(
        f"{n} {rate:,.0f}" + (f" (x{rate / throughput[first]:.2f} of {first})" if n != first
                               else "") for n, rate in throughput.items()))
    summary = {"nproc": opts.nproc, "steps": opts.steps, "model": opts.model,
               "recipes": recipes, "curves": curves, "max_relative_difference": worst,
               "tokens_per_second": throughput}
    (opts.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0 if all(diff <= opts.rtol for diff in worst.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
