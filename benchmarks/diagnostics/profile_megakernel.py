"""Where the forward megakernel's time goes, on one GPU (EP=1, rows pulled from local memory).

For each model shape: the whole megakernel at several row-pulling block counts, the same
launch with a stage removed (ops.PROFILE_SKIP: no pull, no dependency waits, FC1 only, FC2
only, either without its epilogue's stores - their results are meaningless, only their time
counts), and in the same run the
separate kernels that do the same work (pull_rows, FC1 and FC2 through the engine and through
torch._grouped_mm, v1's activation kernel, push_rows). Routing is uniform top-k. The full
megakernel's combine slots are checked bit for bit against the separate engine path first.

    python benchmarks/diagnostics/profile_megakernel.py --out benchmarks/results/<folder>/profile.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import date
from pathlib import Path

# Run from anywhere: the repository (mok_megatron) and scripts/ (the benchmarks' helpers).
REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import torch  # noqa: E402

from bench_gemm import per_gpu_experts  # noqa: E402
from gpu_timing import median_ms  # noqa: E402
from mok_megatron.cuda import ops  # noqa: E402
from mok_megatron.config import load_model  # noqa: E402


def build(model, experts: int, tokens: int, seed: int, timeout_ms: int = 20000) -> dict:
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, H, device="cuda", generator=g).bfloat16()
    ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(K, dim=1).indices
    probs = torch.rand(tokens, K, device="cuda", generator=g)
    n = tokens * K
    keys = ids.flatten().long() * n + torch.arange(n, device="cuda")
    sorted_keys = torch.sort(keys).values
    bounds = torch.arange(experts + 1, device="cuda", dtype=torch.int64) * n
    row_slot = torch.remainder(sorted_keys, n).to(torch.int32)
    return {
        "x": x, "row_slot": row_slot, "row_prob": probs.flatten()[row_slot.long()].contiguous(),
        "offsets": torch.searchsorted(sorted_keys, bounds).to(torch.int32),
        "w1": (torch.randn(experts, 2 * F, H, device="cuda", generator=g) * H**-0.5).bfloat16(),
        "w2": (torch.randn(experts, H, F, device="cuda", generator=g) * F**-0.5).bfloat16(),
        "rows": torch.empty(n, H, device="cuda", dtype=torch.bfloat16),
        "act": torch.empty(n, F, device="cuda", dtype=torch.bfloat16),
        "h": torch.empty(n, 2 * F, device="cuda", dtype=torch.bfloat16),
        "out_rows": torch.empty(n, H, device="cuda", dtype=torch.bfloat16),
        "slots": torch.empty(n, H, device="cuda", dtype=torch.bfloat16),
        "counters": ops.megakernel_counters(n, experts, "cuda"),
        # One "rank" whose workspace base is 0: the offsets are the buffers' addresses.
        "bases": torch.zeros(1, dtype=torch.int64, device="cuda"),
        "tokens": tokens, "topk": K, "timeout_ns": timeout_ms * 1_000_000,
    }


def megakernel(p: dict, comm_blocks: int, skip: int = 0, trace=None, **knobs):
    """One launch of the megakernel on problem p; `skip`: PROFILE_SKIP bits, `trace`: a
    megakernel_trace_buffer to fill (benchmarks/diagnostics/trace_tiles.py), `knobs`: further
    ops.moe_forward_megakernel arguments (e.g. minibatch_rows)."""
    def run():
        p["counters"].zero_()
        ops.moe_forward_megakernel(p["bases"], p["x"].data_ptr(), p["slots"].data_ptr(),
                                   p["offsets"], p["row_slot"], p["row_prob"], p["tokens"],
                                   p["topk"], p["w1"], p["w2"], "swiglu", p["rows"], p["act"],
                                   p["h"], p["counters"], comm_blocks, p["timeout_ns"],
                                   profile_skip=skip, trace=trace, **knobs)
    return run


def cases(args):
    """(model, variant, local experts, tokens) for every combination of --models, --variants
    and --tokens (local experts from --ep)."""
    for name in args.models:
        model = load_model(name)
        for variant in args.variants:
            for tokens in args.tokens:
                yield model, variant, per_gpu_experts(model, variant, args.ep), tokens


def separate(p: dict, engine: bool) -> dict:
    """The v1 sequence as separate launches; FC1 through the engine (activation fused) or
    torch._grouped_mm + v1's activation kernel."""
    num_rows = p["offsets"][-1:]
    offs = p["offsets"][1:]
    n = p["row_slot"].numel()

    def pull():
        ops.pull_rows(p["bases"], p["x"].data_ptr(), p["row_slot"], num_rows, p["tokens"],
                      p["topk"], p["rows"])

    def fc1():
        if engine:
            ops.grouped_gemm(p["rows"], p["w1"], p["offsets"], p["act"], row_prob=p["row_prob"],
                             activation="swiglu", h_out=p["h"])
        else:
            h = torch._grouped_mm(p["rows"], p["w1"].transpose(1, 2), offs=offs)
            ops.activation_forward(h, p["row_prob"], num_rows, "swiglu", p["act"])

    def fc2():
        if engine:
            ops.grouped_gemm(p["act"], p["w2"], p["offsets"], p["out_rows"])
        else:
            p["out_rows"].copy_(torch._grouped_mm(p["act"], p["w2"].transpose(1, 2), offs=offs))

    def push():
        ops.push_rows(p["bases"], p["slots"].data_ptr(), p["row_slot"], num_rows, n,
                      p["out_rows"])

    def whole():
        pull(), fc1(), fc2(), push()
    return {"pull": pull, "fc1": fc1, "fc2": fc2, "push": push, "whole": whole}


def run_case(model, variant: str, experts: int, tokens: int, comm_list, args) -> dict:
    p = build(model, experts, tokens, args.seed, args.timeout_ms)
    eng, tor = separate(p, engine=True), separate(p, engine=False)
    eng["whole"]()
    expected = p["slots"].clone()
    p["slots"].fill_(float("nan"))
    megakernel(p, comm_list[0])()
    torch.cuda.synchronize()
    identical = torch.equal(expected, p["slots"])
    if not identical:
        raise SystemExit(f"{model.name} {variant} T={tokens}: megakernel slots differ from the "
                         "separate engine path")
    t = lambda fn: median_ms(fn, args.iters, args.warmup)  # noqa: E731
    skip = ops.PROFILE_SKIP
    times = {f"megakernel_comm{c}": t(megakernel(p, c)) for c in comm_list}
    times["no_pull_comm0"] = t(megakernel(p, 0, skip["pull"]))
    times["no_pull_no_waits_comm0"] = t(megakernel(p, 0, skip["pull"] | skip["waits"]))
    times["fc1_only_comm0"] = t(megakernel(p, 0, skip["pull"] | skip["fc2"]))
    times["fc2_only_comm0"] = t(megakernel(p, 0, skip["pull"] | skip["fc1"]))
    # The epilogues' share: the same tiles with their stores left out.
    times["fc1_only_no_stores_comm0"] = t(megakernel(p, 0, skip["pull"] | skip["fc2"]
                                                     | skip["stores"]))
    times["fc2_only_no_stores_comm0"] = t(megakernel(p, 0, skip["pull"] | skip["fc1"]
                                                     | skip["stores"]))
    # The mainloops' two sides alone (stores left out too): loads without MMAs, MMAs on
    # whatever the stages hold without loads.
    for phase, other in (("fc1", "fc2"), ("fc2", "fc1")):
        base = skip["pull"] | skip[other] | skip["stores"]
        times[f"{phase}_only_loads_only_comm0"] = t(megakernel(p, 0, base | skip["mma"]))
        times[f"{phase}_only_mma_only_comm0"] = t(megakernel(p, 0, base | skip["loads"]))
    for name, fn in eng.items():
        times[f"engine_{name}"] = t(fn)
    for name in ("fc1", "fc2", "whole"):
        times[f"torch_{name}"] = t(tor[name])
    H, F = model.hidden_size, model.moe_ffn_hidden_size
    flops = 6 * tokens * model.topk * H * F
    result = {"model": model.name, "variant": variant, "experts": experts, "tokens": tokens,
              "rows": tokens * model.topk, "flops": flops, "bitwise_vs_separate": identical,
              "ms": times}
    best = min(v for k, v in times.items() if k.startswith("megakernel_"))
    print(f"{model.name:<20} {variant:<4} E={experts:<3} T={tokens:<5} "
          + " ".join(f"{k}={v:.3f}" for k, v in times.items())
          + f" | best megakernel {flops / best / 1e9:.0f} TF/s", flush=True)
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen3_30b_a3b_like", "deepseek_v3_like"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[2048, 8192])
    ap.add_argument("--variants", nargs="+", default=["full", "ep64"], choices=["full", "ep64"])
    ap.add_argument("--ep", type=int, default=4, help="GPUs the 'full' expert count is split over")
    ap.add_argument("--comm-sms", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-ms", type=int, default=20000, help="bound of every wait")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    results = []
    for model, variant, experts, tokens in cases(args):
        try:
            results.append(run_case(model, variant, experts, tokens, args.comm_sms, args))
        except torch.AcceleratorError:
            # A bounded wait gave up (or a fault): say where, if a wait did.
            print(f"{model.name} {variant} T={tokens}: kernel failed; timeout report: "
                  f"{ops.timeout_reports()}", flush=True)
            raise
        torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"date": date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "torch": torch.__version__, "host": platform.node()}
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
