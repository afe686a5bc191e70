"""Session 30: the FP8 grouped GEMM's outputs on fixed problems, saved for a bit-for-bit
comparison between two builds of the extension (the one first on PYTHONPATH):
the test cases of tests/gpu/test_fp8_blockwise_kernels.py and DeepSeek's E=8 FC1 / FC2 at
T=4096 (the problem bench_gemm times), with and without the SwiGLU x prob epilogue.

    PYTHONPATH=OLD_REPO python engine_outputs.py old.pt; PYTHONPATH=NEW_REPO python ... new.pt
"""

import sys

import torch

from mok_megatron import ops

CASES = [([300, 0, 129, 64, 1], 256, 384), ([128, 256], 7168, 256), ([77, 500, 3], 208, 136),
         ([1000], 2048, 1536), ([64, 200], 128, 256), ([129, 70, 300], 640, 384),
         ([4096] * 8, 7168, 4096), ([4096] * 8, 2048, 7168)]


def case_outputs(counts, k, n, activation, seed):
    if activation == "swiglu":
        n = 2 * max(64, n // 128 * 64)  # gated halves: whole 64-row pieces, as the tests
    g = torch.Generator(device="cuda").manual_seed(seed)
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int32)
    offsets[1:] = torch.tensor(counts).cumsum(0)
    rows = int(offsets[-1])
    a = torch.randn(rows, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(len(counts), n, k, device="cuda", generator=g) * k**-0.5).bfloat16()
    prob = torch.rand(rows, device="cuda", generator=g)
    a_codes, a_scales = ops.fp8_quantize_rows(a)
    w_codes, w_scales = ops.fp8_quantize_weight_blocks(w)
    n_out = n // 2 if activation == "swiglu" else n
    out = torch.full((rows, n_out), float("nan"), device="cuda", dtype=torch.bfloat16)
    h = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16) \
        if activation else None
    ops.fp8_grouped_gemm(a_codes, a_scales, w_codes, w_scales, offsets.cuda(), out,
                         activation=activation, row_prob=prob if activation else None, h_out=h)
    return [out.cpu()] + ([h.cpu()] if h is not None else [])


def main(path):
    saved = {}
    for i, (counts, k, n) in enumerate(CASES):
        for activation in (None, "swiglu"):
            saved[f"{i}_{activation}"] = case_outputs(counts, k, n, activation, seed=i)
    torch.save(saved, path)
    print(f"{len(saved)} problems saved to {path}")


if __name__ == "__main__":
    main(sys.argv[1])
