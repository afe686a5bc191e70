"""Megakernel time vs the pull's publish unit (minibatch_rows), EP=1."""
import sys
import torch
sys.path.insert(0, "scripts")
from profile_megakernel import build, load_model, per_gpu_experts  # noqa: E402
from mok_megatron import ops  # noqa: E402

for name in ("qwen3_30b_a3b_like", "deepseek_v3_like"):
    model = load_model(name)
    for variant in ("ep64", "full"):
        E = per_gpu_experts(model, variant, 1)
        p = build(model, E, 4096, 0)
        res = {}
        for comm in (12, 16):
            for mb in (128, 512, 2048):
                def run():
                    p["counters"].zero_()
                    ops.moe_forward_megakernel(p["bases"], p["x"].data_ptr(), p["slots"].data_ptr(),
                                               p["offsets"], p["row_slot"], p["row_prob"], p["tokens"],
                                               p["topk"], p["w1"], p["w2"], "swiglu", p["rows"], p["act"],
                                               p["h"], p["counters"], comm, p["timeout_ns"],
                                               minibatch_rows=mb)
                for _ in range(3):
                    run()
                torch.cuda.synchronize()
                ts = []
                for _ in range(7):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record(); run(); e.record(); torch.cuda.synchronize()
                    ts.append(s.elapsed_time(e))
                res[(comm, mb)] = sorted(ts)[3]
        print(name[:4], variant, E, " ".join(f"c{c}/mb{m}={v:.3f}" for (c, m), v in res.items()), flush=True)
