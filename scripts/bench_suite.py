"""The benchmark suite, `python scripts/bench_moe.py --suite`: the whole product in one run of
under 10 minutes on one H100, or at EP = GPUs on several.

Every shape of SHAPES runs the baselines (BASELINES: Megatron's alltoall dispatcher around
grouped-GEMM experts; flex + HybridEP where it imports) and then every recipe of
configs/recipes/ (as shipped, but for the kernels) on every kernel path of PATHS. The first
baseline that runs (alltoall) is the correctness reference: each path is checked against it
first (relative L2 of y, dx, dprobs and two experts' weight gradients, within its recipe's
tolerance, bench_moe.CHECK_TOLERANCE) and then timed as bench_moe times every path
(measure_path: eager calls, each synchronized, after 0.3 s of dense matmuls; median over
--iters of the max over ranks). Nothing is skipped silently: a configuration the recipe's
checks refuse is recorded as "refused: <reason>", a baseline that does not import as
"unavailable: <ImportError>", a call that fails as "error: <what>" (the next path starts from
a fresh workspace).

Outputs (rank 0), under benchmarks/results/<card>-<date>/ or --out: COMMAND.txt at the start;
results.json after every configuration, so a run cut short keeps what it measured; chart.png
(fwd+bwd speedup over alltoall) and README.md (generated, with scripts/bench_table.py's table)
after every shape.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import re
import subprocess
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
import torch.distributed as dist

import bench_table
from bench_moe import (CHECK_TOLERANCE, CHECKED, REPO, STARTED, MegatronBaseline, MokPath,
                       check_errors, command_line, git_commit, layer_flops, layer_outputs,
                       log0, make_problem, measure_path, roofline, row_counts)
from mok_megatron.activations import get_activation
from mok_megatron.config import (Recipe, load_model, load_recipe, recipe_problems,
                                 resolve_kernels)
from mok_megatron.cuda import mxfp8_weights
from mok_megatron.cuda.workspace import release_workspace


@dataclass(frozen=True)
class Shape:
    model: str    # configs/models name
    variant: str  # "full": every expert over the EP group; "ep64": the EP64-equivalent
    tokens: int   # tokens per GPU
    why: str      # what the shape stands for


# In run order: the shapes that take least memory first; DeepSeek-V3's full expert count
# (22.5 GB of bf16 weights and as much gradient on one GPU, with the FP8 weight caches beside
# them) and gpt-oss's H not a multiple of 128 (the shape most likely to fail) last, so a
# failure there costs no other shape's figures.
SHAPES = (
    Shape("qwen3_30b_a3b_like", "full", 4096, "Qwen3-30B-A3B-like, all 128 experts"),
    Shape("qwen3_30b_a3b_like", "full", 8192, "Qwen3-30B-A3B-like, all 128 experts"),
    Shape("qwen3_30b_a3b_like", "ep64", 4096, "Qwen3-30B-A3B-like at EP64: 8 experts per GPU"),
    Shape("qwen3_30b_a3b_like", "ep64", 8192, "Qwen3-30B-A3B-like at EP64: 8 experts per GPU"),
    Shape("deepseek_v3_like", "ep64", 4096, "DeepSeek-V3-like at EP64: 8 experts per GPU"),
    Shape("deepseek_v3_like", "ep64", 8192, "DeepSeek-V3-like at EP64: 8 experts per GPU"),
    Shape("mok_bench", "ep64", 4096, "MoK's shape at EP64: 6 experts per GPU"),
    Shape("mok_bench", "ep64", 8192, "MoK's shape at EP64: 6 experts per GPU"),
    Shape("mixtral_8x7b_like", "full", 4096, "Mixtral-8x7B-like: 8 experts with a large FFN"),
    Shape("qwen3_30b_a3b_like", "full", 512,
          "Qwen3-30B-A3B-like at a small token count: 32 rows per expert"),
    Shape("deepseek_v3_like", "full", 4096, "DeepSeek-V3-like, all 256 experts"),
    Shape("deepseek_v3_like", "full", 8192, "DeepSeek-V3-like, all 256 experts"),
    Shape("gpt_oss_20b_like", "full", 4096,
          "gpt-oss-20b-like: H=2880, not a multiple of 128"),
)

RECIPES = ("bf16", "mxfp8", "fp8_blockwise")
# Kernel path -> (kernel.forward_kernel, kernel.backward_kernel).
PATHS = {"separate": ("separate", "separate"),
         "fwd_megakernel": ("megakernel", "separate"),
         "bwd_megakernel": ("separate", "megakernel"),
         "megakernels": ("megakernel", "megakernel")}
# Baseline path -> MegatronBaseline's dispatcher; they run the bf16 recipe.
BASELINES = {"alltoall": "alltoall", "flex+hybridep": "hybridep"}
SPEEDUP_BASELINE = "alltoall"  # the path "speedup_vs_alltoall" is over

# The time model of estimated_seconds, for one H100: each call's GPU work at an effective
# 600 TFLOP/s plus a host launch and synchronization, and what every measurement costs
# whatever its shape.
EFFECTIVE_FLOPS = 600e12
CALL_OVERHEAD_S = 1e-3
PRECONDITION_S = 0.3  # gpu_timing.precondition, before each of a path's two timings
PATH_SETUP_S = 0.3    # a workspace, the memory statistics, a cache emptied
SHAPE_SETUP_S = 2.0   # the problem's tensors, row counts, a workspace released
# Imports, the process group, the peaks and the kernels' first launches (2-3 s each for the
# first call of a process: benchmarks/results/h200-2026-12-01-first-call-cost).
STARTUP_S = 60.0
TIME_LIMIT_S = 600.0

GIB = 2**30


# ------------------------------------------------------------------------------ the plan


def suite_shapes(models: Optional[list[str]] = None,
                 tokens: Optional[list[int]] = None) -> list[Shape]:
    """SHAPES, narrowed to `models` and `tokens` where given."""
    shapes = [s for s in SHAPES if (not models or s.model in models)
              and (not tokens or s.tokens in tokens)]
    if not shapes:
        raise SystemExit(f"no suite shape has model {models} and tokens {tokens}; the suite's: "
                         + ", ".join(f"{s.model} {s.variant} T={s.tokens}" for s in SHAPES))
    return shapes


def configurations(recipes: tuple[str, ...]) -> list[tuple[str, str]]:
    """(recipe, path) in run order: the baselines (bf16), then each recipe on each path."""
    return ([("bf16", b) for b in BASELINES]
            + [(recipe, path) for recipe in recipes for path in PATHS])


def default_paths(recipes: tuple[str, ...], world: int,
                  backward_inputs: Optional[str] = None) -> dict[str, str]:
    """Each recipe's path as shipped at EP = world: its yaml's forward_kernel and
    backward_kernel, "auto" resolved as a call resolves it (config.resolve_kernels)."""
    out = {}
    for name in recipes:
        shipped = load_recipe(name)
        if backward_inputs:
            shipped = dataclasses.replace(shipped, kernel=dataclasses.replace(
                shipped.kernel, backward_inputs=backward_inputs))
        k = resolve_kernels(shipped, world).kernel
        out[name] = next(p for p, kernels in PATHS.items()
                         if kernels == (k.forward_kernel, k.backward_kernel))
    return out


def path_recipe(recipe: str, path: str, tokens: int,
                backward_inputs: Optional[str] = None) -> Recipe:
    """configs/recipes/<recipe>.yaml on the path's kernels, its workspace sized for `tokens`
    per rank (as a deployment sizes it for its micro-batch), and --backward-inputs if given."""
    shipped = load_recipe(recipe)
    forward_kernel, backward_kernel = PATHS[path]
    knobs = dataclasses.replace(shipped.kernel, forward_kernel=forward_kernel,
                                backward_kernel=backward_kernel, max_tokens_per_rank=tokens,
                                backward_inputs=backward_inputs or shipped.kernel.backward_inputs)
    return dataclasses.replace(shipped, kernel=knobs)


def refusal(recipe: Recipe) -> Optional[str]:
    """Why the recipe's own checks (config.recipe_problems) refuse it, else None."""
    problem = next(recipe_problems(recipe), None)
    return None if problem is None else f"refused: {problem[0]}: {problem[1]}"


def estimated_seconds(shape: Shape, iters: int, warmup: int, paths: int) -> float:
    """One shape's time by the model above: `paths` configurations, each checked (one fwd+bwd)
    and timed (warmup + iters calls of fwd and of fwd+bwd, then one of each for peak memory
    and one forward for what it keeps)."""
    model = load_model(shape.model)
    gated = get_activation(model.activation).gated
    rows = shape.tokens * model.topk
    fwd = layer_flops(rows, model.hidden_size, model.moe_ffn_hidden_size, gated, False)
    both = layer_flops(rows, model.hidden_size, model.moe_ffn_hidden_size, gated, True)
    calls = warmup + iters + 2  # of fwd, and as many of fwd+bwd
    per_path = (2 * PRECONDITION_S + PATH_SETUP_S + calls * (fwd + both) / EFFECTIVE_FLOPS
                + 2 * calls * CALL_OVERHEAD_S)
    return SHAPE_SETUP_S + paths * per_path


def plan_lines(shapes: list[Shape], recipes: tuple[str, ...], iters: int, warmup: int,
               world: int) -> tuple[list[str], float]:
    """The plan, one line per shape with its estimated seconds, and the estimated total."""
    configs = len(configurations(recipes))
    lines, total = [], STARTUP_S
    for s in shapes:
        seconds = estimated_seconds(s, iters, warmup, configs)
        total += seconds
        lines.append(f"  {s.model:<20} {s.variant:<5} T={s.tokens:<5} {configs} configurations "
                     f"~{seconds:5.1f} s  ({s.why})")
    lines.append(f"  recipes {', '.join(recipes)} x paths {', '.join(PATHS)}, baselines "
                 f"{', '.join(BASELINES)}; EP={world}; {iters} timed calls after {warmup}")
    lines.append(f"  estimated total ~{total:.0f} s (one H100: {EFFECTIVE_FLOPS / 1e12:.0f} "
                 f"TFLOP/s effective, {STARTUP_S:.0f} s start-up; limit {TIME_LIMIT_S:.0f} s)")
    return lines, total


def selected_recipes(args) -> tuple[str, ...]:
    return tuple(r for r in RECIPES if not args.recipe or r in args.recipe)


def print_plan(args, world: int) -> None:
    lines, _ = plan_lines(suite_shapes(args.models, args.tokens), selected_recipes(args),
                          args.iters, args.warmup, world)
    print("benchmark suite plan:\n" + "\n".join(lines))


# ------------------------------------------------------------------------------ rows


def check_result(errors: dict[str, float], tolerance: float, against: str) -> dict:
    """A path's check: passed where no relative L2 error exceeds the tolerance (NaN fails)."""
    worst = max(errors.values())
    if any(e != e for e in errors.values()):
        worst = float("nan")
    return {"against": against, "rel_l2": errors, "worst": worst, "tolerance": tolerance,
            "passed": worst <= tolerance}


def measured_fields(m: dict, roofs: dict, grad_bytes: int) -> dict:
    """A row's figures from measure_path's dict: milliseconds, peak memory in GiB (fwd+bwd's
    beyond the gradients, which every path allocates alike), TFLOP/s on the FLOPs the layer
    must do, and the roofline's floor as a percentage of the time."""
    times = {"fwd": m["fwd_s"], "fwd_bwd": m["both_s"]}
    fields = {"fwd_ms": m["fwd_s"] * 1e3, "bwd_ms": m["bwd_s"] * 1e3,
              "fwd_bwd_ms": m["both_s"] * 1e3,
              "peak_fwd_gib": m["peak_fwd_bytes"] / GIB,
              "peak_fwd_bwd_gib": (m["peak_both_bytes"] - grad_bytes) / GIB,
              "kept_for_backward_gib": m["kept_for_backward_bytes"] / GIB}
    for key, t in times.items():
        fields[f"tflops_{key}"] = roofs[key]["flops"] / t / 1e12
        fields[f"roofline_pct_{key}"] = 100 * roofs[key]["floor_s"] / t
    return fields


def roofline_fields(roof: dict) -> dict:
    return {"flops": roof["flops"], "floor_ms": roof["floor_s"] * 1e3,
            "binding": roof["binding"],
            "terms_ms": {k: v * 1e3 for k, v in roof["terms_s"].items()}}


def _speedups(row: dict, other: Optional[dict]) -> Optional[dict]:
    """other's time over row's, per direction (above 1: row is faster)."""
    if other is None or other.get("status") != "ok":
        return None
    return {key: other[f"{key}_ms"] / row[f"{key}_ms"] for key in ("fwd", "bwd", "fwd_bwd")}


def with_speedups(rows: list[dict], defaults: dict[str, str]) -> list[dict]:
    """The rows with speedup_vs_alltoall and speedup_vs_default (over the row's recipe on its
    path as shipped, `defaults`; the baselines run bf16) from the other rows of their shape."""
    index = {(r["model"], r["variant"], r["tokens"], r["recipe"], r["path"]): r for r in rows}
    out = []
    for r in rows:
        shape = (r["model"], r["variant"], r["tokens"])
        ok = r["status"] == "ok"
        baseline = index.get((*shape, "bf16", SPEEDUP_BASELINE))
        default = index.get((*shape, r["recipe"], defaults.get(r["recipe"])))
        out.append({**r, "speedup_vs_alltoall": _speedups(r, baseline) if ok else None,
                    "speedup_vs_default": _speedups(r, default) if ok else None})
    return out


def format_row(r: dict) -> str:
    head = (f"{r['model']:<20} {r['variant']:<5} E={r['experts']:<4} T={r['tokens']:<5} "
            f"{r['recipe']:<13} {r['path']:<14}")
    if r["status"] != "ok":
        return f"{head} {r['status']}"
    vs = r.get("speedup_vs_alltoall") or {}
    check = r.get("check")
    checked = ("reference" if check is None else
               f"rel-L2 {check['worst']:.1e} {'<=' if check['passed'] else 'FAILS >'} "
               f"{check['tolerance']:g}")
    a2a = f"x{vs['fwd_bwd']:.2f} vs alltoall" if vs else "no alltoall"
    return (f"{head} fwd {r['fwd_ms']:7.2f} bwd {r['bwd_ms']:7.2f} fwd+bwd "
            f"{r['fwd_bwd_ms']:7.2f} ms {r['tflops_fwd_bwd']:4.0f} TF/s "
            f"{r['roofline_pct_fwd_bwd']:3.0f}% roof[{r['roofline']['fwd_bwd']['binding']}] "
            f"{a2a}, peak {r['peak_fwd_bwd_gib']:.2f} GiB, {checked}")


# ------------------------------------------------------------------------------ outputs


def card_slug(device_name: str, gpus: int) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', with 2 GPUs 'h100x2': the model number where the
    name has one (one or two capitals and 2-3 digits), else the whole name, lower case."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,3})\b", device_name)
    slug = m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return slug if gpus == 1 else f"{slug}x{gpus}"


def default_out_dir(device_name: str, gpus: int, day: datetime.date) -> Path:
    return REPO / "benchmarks" / "results" / f"{card_slug(device_name, gpus)}-{day.isoformat()}"


def command_text(meta: dict) -> str:
    return (f"{meta['command']}\n\n"
            f"commit   {meta['commit']}{' (with uncommitted changes)' if meta['dirty'] else ''}\n"
            f"card     {meta['gpus']}x {meta['card']}\n"
            f"date     {meta['date']}\n"
            f"torch    {meta['torch']} (CUDA {meta['cuda']})\n"
            f"megatron-core {meta['megatron_core']}\n"
            f"host     {meta['host']}\n")


def _pairs(mapping: dict) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in mapping.items())


def readme_text(doc: dict) -> str:
    """The folder's README: what the suite measured and how, then its table."""
    meta, rows = doc["meta"], doc["rows"]
    counts = {word: sum(r["status"].startswith(word) for r in rows)
              for word in ("refused", "unavailable", "error")}
    outside = sum(bool(r.get("check")) and not r["check"]["passed"] for r in rows)
    peaks = meta["peaks"]
    link = (f"NVLink {peaks['nvlink_bytes_per_s'] / 1e9:.0f} GB/s one way" if meta["gpus"] > 1
            else "no NVLink term on one GPU")
    return f"""# MoE layer benchmark suite: {meta['gpus']}x {meta['card']}, {meta['date'][:10]}

Generated by `scripts/bench_moe.py --suite`; do not edit. The table below is
`python scripts/bench_table.py results.json`.

{bench_table.source_line(doc)}

What it measured, at EP={meta['gpus']}, with the same weights and uniform random top-k routing
for every path of a shape:
- The routed experts of one MoE layer: dispatch, expert MLPs, combine (a shared expert is a
  dense MLP, the same under every dispatcher).
- Baselines: Megatron's alltoall dispatcher around grouped-GEMM experts, the reference every
  other path is checked against; flex + HybridEP where it imports. Found:
  {_pairs(meta['baselines'])}.
- mok under each recipe ({', '.join(meta['recipes'])}) as shipped in configs/recipes/, on each
  kernel path (separate: both directions on the separate kernels; fwd_megakernel,
  bwd_megakernel: that direction on its megakernel; megakernels: both), the workspace sized
  for the shape's tokens; backward inputs: {meta['backward_inputs']}.
- Correctness first: relative L2 of y, dx, dprobs and two experts' weight gradients against
  the reference, within the recipe's tolerance ({_pairs(meta['tolerance'])}).
- Times: eager calls, each synchronized, after 0.3 s of dense matmuls; the median over
  {meta['iters']} timed calls (after {meta['warmup']}) of the max over ranks. bwd is fwd+bwd
  minus the no-grad fwd.
- Peak memory: what one fwd+bwd allocates beyond what was allocated before it, the gradients
  (the same for every path) and an FP8 recipe's weight cache (filled once per optimizer step,
  by the check's call) excluded.
- Roofline: the largest of three floors at the peaks this run measured: the FLOPs the layer
  must do (6 rows H F forward for SwiGLU, twice that backward, never the FC1 a recomputing
  backward runs again) at the bf16 grouped-GEMM rate
  ({peaks['grouped_gemm_flops'] / 1e12:.0f} TFLOP/s, for every recipe: an FP8 recipe can pass
  100%); HBM at {peaks['hbm_bytes_per_s'] / 1e12:.2f} TB/s read+write; {link}.
- Speedups (fwd+bwd): over alltoall, and over the recipe on its path as shipped ("default":
  {_pairs(meta['default_paths'])}).

Not run: {counts['refused']} refused, {counts['unavailable']} unavailable, {counts['error']}
failed; {outside} ran outside their tolerance.

![fwd+bwd speedup over alltoall](chart.png)

{bench_table.render_table(doc)}"""


def draw_chart(rows: list[dict], path: Path) -> Optional[str]:
    """fwd+bwd speedup over alltoall, one group of bars per shape, one bar per recipe x path
    (no bar where the configuration did not run); a note instead where matplotlib is missing
    (it comes with the package's bench extra: pip install -e .[bench])."""
    try:
        import matplotlib
    except ImportError as err:
        return f"chart skipped: {err} (pip install -e .[bench])"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def shape(r):
        return r["model"], r["variant"], r["experts"], r["tokens"]

    speedup = {(*shape(r), r["recipe"], r["path"]):
               (r.get("speedup_vs_alltoall") or {}).get("fwd_bwd") for r in rows}
    shapes = list(dict.fromkeys(shape(r) for r in rows))
    # One bar series per recipe x path with a speedup anywhere (alltoall's own is 1).
    series = list(dict.fromkeys((r["recipe"], r["path"]) for r in rows
                                if r["path"] != SPEEDUP_BASELINE
                                and speedup[(*shape(r), r["recipe"], r["path"])] is not None))
    maps = {"bf16": "Blues", "mxfp8": "Greens", "fp8_blockwise": "Oranges"}
    fig, ax = plt.subplots(figsize=(max(10, len(shapes) * 1.6), 6))
    width = 0.85 / max(1, len(series))
    for i, (recipe, p) in enumerate(series):
        shade = 0.45 + 0.5 * (list(PATHS).index(p) / (len(PATHS) - 1) if p in PATHS else 0)
        color = plt.get_cmap(maps.get(recipe, "Greys"))(shade) if p in PATHS else "tab:purple"
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(shapes))]
        ys = [speedup.get((*key, recipe, p)) for key in shapes]
        ax.bar([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None],
               width, label=f"{recipe} {p}", color=color)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"{m}\n{v} E={e} T={t}" for m, v, e, t in shapes], fontsize=7)
    ax.set_ylabel("fwd+bwd speedup over Megatron alltoall")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


class SuiteWriter:
    """Rank 0's outputs: COMMAND.txt at once, results.json after every row (written to a
    temporary file and renamed, so a run killed mid-write keeps the previous one), chart.png
    and README.md after every shape."""

    def __init__(self, out: Path, meta: dict, defaults: dict[str, str]):
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.defaults = out, defaults
        self.doc = {"meta": meta, "rows": []}
        (out / "COMMAND.txt").write_text(command_text(meta))
        self.write_json()

    def add(self, row: dict) -> dict:
        """Adds the row and returns it with its speedups (which later rows may complete)."""
        self.doc["rows"] = with_speedups(self.doc["rows"] + [row], self.defaults)
        self.write_json()
        return self.doc["rows"][-1]

    def write_json(self) -> None:
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.doc, indent=1))
        tmp.replace(self.out / "results.json")

    def shape_done(self, elapsed_s: float, complete: bool = False) -> None:
        self.doc["meta"].update(elapsed_s=elapsed_s, complete=complete)
        self.write_json()
        note = draw_chart(self.doc["rows"], self.out / "chart.png")
        if note:
            print(note, flush=True)
        (self.out / "README.md").write_text(readme_text(self.doc))


# ------------------------------------------------------------------------------ running


def attempt(what: Callable, named: tuple = ()) -> tuple[object, Optional[str]]:
    """`what()` on every rank, with a failure agreed on by all: (its value, None), or (None,
    status). The status is "<word>: <message>" with the word `named` (pairs of exception types
    and a word) gives the exception, else "error: <type>: <message>"; a rank that ran while
    another failed says so. Every exception is caught: the row records it and the suite goes
    on. One rank needs no agreement (and a CUDA error that poisoned the context would fail
    the collective before the row is written)."""
    value, status = None, None
    try:
        value = what()
    except Exception as err:  # noqa: BLE001 - recorded in the row, never lost
        word = next((w for types, w in named if isinstance(err, types)), None)
        status = f"{word}: {err}" if word else f"error: {type(err).__name__}: {err}"
        if word is None:
            traceback.print_exc()
    if dist.get_world_size() == 1:
        return value, status
    failed = torch.tensor(int(status is not None), device="cuda")
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item() and status is None:
        value, status = None, "error: failed on another rank"
    return value, status


def agreed_errors(errors: dict[str, float]) -> dict[str, float]:
    """Each relative error, max over ranks."""
    if dist.get_world_size() == 1:
        return errors
    t = torch.tensor(list(errors.values()), device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(errors, t.tolist()))


# The kernels' own checks (symm_moe.check_kernel_call: shapes, recipe) raise these before
# any collective or allocation: a refusal, not a failure.
KERNEL_REFUSALS = (((ValueError, NotImplementedError), "refused"),)


def build(recipe: str, path: str, model, experts: int, tokens: int, args, group):
    """(what the configuration calls, None), or (None, why nothing): a baseline that does not
    import is unavailable, one that cannot take the shape and a recipe its own checks refuse
    are refused."""
    if path in BASELINES:
        return attempt(lambda: MegatronBaseline(model, experts, BASELINES[path]),
                       ((ImportError, "unavailable"), (ValueError, "refused")))
    kernels = path_recipe(recipe, path, tokens, args.backward_inputs)
    status = refusal(kernels)
    return (None, status) if status else (MokPath(group, kernels), None)


def check_and_time(fn, row: dict, problem, reference, args, roofs, grad_bytes):
    """The configuration checked against the reference's outputs (the first configuration to
    run is the reference), then timed, into `row`. Returns (status, reference): status None
    where both ran."""
    refusals = () if row["path"] in BASELINES else KERNEL_REFUSALS
    outs, status = attempt(lambda: layer_outputs(fn, *problem), refusals)
    if status is not None:
        return status, reference
    if reference is None:
        reference = (f"{row['recipe']} {row['path']}", outs)
    else:
        errors = agreed_errors(check_errors(outs, reference[1]))
        row["check"] = check_result(errors, CHECK_TOLERANCE[load_recipe(row["recipe"]).precision],
                                    reference[0])
    del outs
    m, status = attempt(lambda: measure_path(fn, *problem, args.iters, args.warmup))
    if status is None:
        row.update(measured_fields(m, roofs, grad_bytes))
    return status, reference


def shape_rows(shape: Shape, recipes: tuple[str, ...], args, group, peaks) -> Iterator[dict]:
    """The shape's rows, each yielded as soon as it is measured."""
    world = dist.get_world_size()
    model = load_model(shape.model)
    experts = (model if shape.variant == "full" else model.ep64_equivalent(world)).num_experts
    base = {"model": shape.model, "variant": shape.variant, "experts": experts,
            "tokens": shape.tokens, "hidden": model.hidden_size,
            "ffn": model.moe_ffn_hidden_size, "topk": model.topk, "check": None}
    configs = configurations(recipes)
    if experts % world:
        for recipe, path in configs:
            yield {**base, "recipe": recipe, "path": path,
                   "status": f"refused: {experts} experts do not split over EP={world}"}
        return
    problem = make_problem(model, experts, shape.tokens, args.seed)
    x, ids, probs, w1, w2, _ = problem
    x.requires_grad_()
    probs.requires_grad_()
    rows, remote = row_counts(ids, experts)
    roofs = {"fwd": roofline(model, rows, remote, experts // world, peaks, False),
             "fwd_bwd": roofline(model, rows, remote, experts // world, peaks, True)}
    grad_bytes = sum(t.numel() * t.element_size() for t in (x, probs, w1, w2))
    base.update(rows_max=rows, remote_rows_max=remote,
                roofline={k: roofline_fields(v) for k, v in roofs.items()})
    reference = None  # (recipe and path, outputs) of the first configuration that ran
    for recipe, path in configs:
        row = {**base, "recipe": recipe, "path": path}
        fn, status = build(recipe, path, model, experts, shape.tokens, args, group)
        if status is None:
            status, reference = check_and_time(fn, row, problem, reference, args, roofs,
                                               grad_bytes)
        del fn
        row["status"] = status or "ok"
        yield row
        # What the path leaves behind goes before the next: the weight caches it filled, and
        # after a failure the workspace (a call stopped midway leaves its barrier counters out
        # of step). A CUDA error that poisoned the context raises here and ends the run; the
        # rows written so far stay.
        mxfp8_weights.clear()
        if status is not None:
            release_workspace(group, x.device)
        torch.cuda.empty_cache()
    release_workspace(group, x.device)


def out_dir(args, world: int) -> Path:
    """--out, or benchmarks/results/<card>-<date>/ (UTC) where no results.json is there yet:
    decided on rank 0 for all."""
    decided = [None]
    if dist.get_rank() == 0:
        path = args.out or default_out_dir(torch.cuda.get_device_name(), world,
                                           datetime.datetime.now(datetime.timezone.utc).date())
        exists = args.out is None and (path / "results.json").exists()
        decided = [f"{path} holds a suite's results already: pass --out" if exists else path]
    dist.broadcast_object_list(decided, src=0)
    if isinstance(decided[0], str):
        raise SystemExit(decided[0])
    return decided[0]


def run_meta(args, card: str, world: int, peaks: dict, others: dict, recipes, shapes,
             estimate_s: float) -> dict:
    """results.json's meta: what ran where, how, and with which peaks."""
    import megatron.core

    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip() != ""
    return {"suite": "scripts/bench_moe.py --suite",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "card": card, "gpus": world, "commit": git_commit(),
            "dirty": dirty, "torch": torch.__version__, "cuda": torch.version.cuda,
            "megatron_core": megatron.core.__version__, "host": platform.node(),
            "command": command_line(world), "iters": args.iters, "warmup": args.warmup,
            "seed": args.seed, "backward_inputs": args.backward_inputs or "as shipped",
            "timing": "eager, each call synchronized",
            "recipes": list(recipes), "paths": list(PATHS), "baselines": others,
            "tolerance": {r: CHECK_TOLERANCE[load_recipe(r).precision] for r in recipes},
            "default_paths": default_paths(recipes, world, args.backward_inputs), "checked": list(CHECKED), "peaks": peaks,
            "shapes": [dataclasses.asdict(s) for s in shapes], "estimated_s": estimate_s,
            "elapsed_s": 0.0, "complete": False}


def run(args, group, peaks, others) -> None:
    """The suite on the process group, each row printed with the running total of seconds
    since the process started, next to the estimate."""
    world = dist.get_world_size()
    shapes, recipes = suite_shapes(args.models, args.tokens), selected_recipes(args)
    lines, estimate = plan_lines(shapes, recipes, args.iters, args.warmup, world)
    log0("benchmark suite plan:\n" + "\n".join(lines))
    out = out_dir(args, world)
    writer = None
    if dist.get_rank() == 0:
        meta = run_meta(args, torch.cuda.get_device_name(), world, peaks, others, recipes,
                        shapes, estimate)
        writer = SuiteWriter(out, meta, default_paths(recipes, world, args.backward_inputs))
        log0(f"writing {out}")
    complete = False
    try:
        for shape in shapes:
            for row in shape_rows(shape, recipes, args, group, peaks):
                if writer is not None:
                    row = writer.add(row)
                log0(f"{format_row(row)}  [{time.monotonic() - STARTED:.0f} s, "
                     f"~{estimate:.0f} s estimated]")
            complete = shape == shapes[-1]
            if writer is not None and not complete:
                writer.shape_done(time.monotonic() - STARTED)
    finally:  # a run that stops on an error still gets its chart and README
        if writer is not None:
            writer.shape_done(time.monotonic() - STARTED, complete)
    log0(f"suite done in {time.monotonic() - STARTED:.0f} s (estimated ~{estimate:.0f} s): {out}")
