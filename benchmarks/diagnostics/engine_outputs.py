"""The FP8 grouped GEMM's outputs on fixed problems, for a bit-for-bit comparison between two
builds of the extension (whichever mok_megatron is first on the path): the kernel tests' cases,
DeepSeek's E=8 FC1 / FC2 at T=4096 (what bench_gemm times), and a problem whose scale codes
take every special value (all-zero and tiny row blocks: code 0; a NaN row and a NaN weight
block: code 255; a tiny weight block) - each with and without the SwiGLU x prob epilogue.

    PYTHONPATH=OLD_REPO python benchmarks/diagnostics/engine_outputs.py save old.pt
    PYTHONPATH=NEW_REPO python benchmarks/diagnostics/engine_outputs.py save new.pt
    python benchmarks/diagnostics/engine_outputs.py compare old.pt new.pt
"""

from __future__ import annotations

import sys

import torch

CASES = [([300, 0, 129, 64, 1], 256, 384), ([128, 256], 7168, 256), ([77, 500, 3], 208, 136),
         ([1000], 2048, 1536), ([64, 200], 128, 256), ([129, 70, 300], 640, 384),
         ([4096] * 8, 7168, 4096), ([4096] * 8, 2048, 7168)]
SPECIAL = ([200, 77], 640, 512)


def operands(counts, k, n, seed, special: bool):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = sum(counts)
    a = torch.randn(rows, k, device="cuda", generator=g)
    w = torch.randn(len(counts), n, k, device="cuda", generator=g) * k**-0.5
    if special:
        a[0] = 0.0                                  # code 0, zero codes
        a[1] *= 2.0**-130                           # code 0, nonzero codes
        a[2, 5] = float("nan")                      # code 255
        a[130:140, 128:256] = 0.0                   # zero blocks inside a tile
        w[0, :128, :128] *= 2.0**-128               # a tiny weight block: code 0
        w[1, 128:256, 256:384] = float("nan")       # a NaN weight block: code 255
    prob = torch.rand(rows, device="cuda", generator=g)
    return a.bfloat16(), w.bfloat16(), prob


def case_outputs(counts, k, n, activation, seed, special=False):
    from mok_megatron.cuda import ops

    if activation == "swiglu":
        n = 2 * max(64, n // 128 * 64)  # gated halves: whole 64-row pieces, as the tests
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int32)
    offsets[1:] = torch.tensor(counts).cumsum(0)
    a, w, prob = operands(counts, k, n, seed, special)
    rows = a.shape[0]
    a_codes, a_scales = ops.fp8_quantize_rows(a)
    w_codes, w_scales = ops.fp8_quantize_weight_blocks(w)
    n_out = n // 2 if activation == "swiglu" else n
    out = torch.full((rows, n_out), float("nan"), device="cuda", dtype=torch.bfloat16)
    h = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16) \
        if activation else None
    ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets.cuda(), out,
                         activation=activation, row_prob=prob if activation else None, h_out=h)
    return [out.cpu()] + ([h.cpu()] if h is not None else [])


def save(path):
    saved = {}
    for i, (counts, k, n) in enumerate(CASES):
        for activation in (None, "swiglu"):
            saved[f"{i}_{activation}"] = case_outputs(counts, k, n, activation, seed=i)
    for activation in (None, "swiglu"):
        saved[f"special_{activation}"] = case_outputs(*SPECIAL, activation, seed=99,
                                                      special=True)
    torch.save(saved, path)
    print(f"{len(saved)} problems saved to {path}")


def compare(old_path, new_path) -> int:
    old, new = torch.load(old_path), torch.load(new_path)
    differ = [name for name in old
              if any(not torch.equal(a.view(torch.int16), b.view(torch.int16))
                     for a, b in zip(old[name], new[name]))]
    print(f"{len(old) - len(differ)} of {len(old)} problems bit-identical"
          + (f"; differ: {differ}" if differ else ""))
    return 1 if differ or old.keys() != new.keys() else 0


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(sys.argv[2])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
