"""Branch check: the 2-CTA pair engine gives the same bits as the engine (MOK_ENGINE_PAIRS)."""
import os
import torch
from mok_megatron import ops

torch.manual_seed(0)
dev = "cuda"
bad = 0
for (E, H, F, counts, gated) in [
    (8, 2048, 768, [300, 0, 128, 129, 1, 640, 64, 257], True),
    (8, 2048, 768, [300, 0, 128, 129, 1, 640, 64, 257], False),
    (4, 1024, 512, [1, 2, 3, 4], True),
    (16, 2048, 768, [256] * 16, True),
    (3, 512, 256, [1000, 1, 129], False),
]:
    rows = sum(counts)
    off = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32, device=dev)
    if gated:
        a = torch.randn(rows, H, device=dev).bfloat16()
        w = (torch.randn(E, 2 * F, H, device=dev) / H ** 0.5).bfloat16()
        prob = torch.rand(rows, device=dev)
        outs = []
        for mode in ("0", "1", "2"):
            os.environ["MOK_ENGINE_PAIRS"] = mode
            out = torch.full((rows, F), float("nan"), device=dev, dtype=torch.bfloat16)
            h = torch.full((rows, 2 * F), float("nan"), device=dev, dtype=torch.bfloat16)
            ops.grouped_gemm(a, w, off, out, activation="swiglu", row_prob=prob, h_out=h)
            torch.cuda.synchronize()
            outs.append((out, h))
        same = all(torch.equal(outs[0][0], o[0]) and torch.equal(outs[0][1], o[1]) for o in outs[1:])
    else:
        a = torch.randn(rows, F, device=dev).bfloat16()
        w = (torch.randn(E, H, F, device=dev) / F ** 0.5).bfloat16()
        outs = []
        for mode in ("0", "1", "2"):
            os.environ["MOK_ENGINE_PAIRS"] = mode
            out = torch.full((rows, H), float("nan"), device=dev, dtype=torch.bfloat16)
            ops.grouped_gemm(a, w, off, out)
            torch.cuda.synchronize()
            outs.append(out)
        same = all(torch.equal(outs[0], o) for o in outs[1:])
    ref = outs[0][0] if gated else outs[0]
    print(f"E={E} counts={counts} gated={gated}: identical={same}, nan={bool(torch.isnan(ref).any())}")
    bad += not same
print("PAIR CHECK", "FAIL" if bad else "OK")
