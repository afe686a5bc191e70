"""One engine FC1 (SwiGLU x prob, writing h) and one FC2 on a bench_gemm shape, twice, for
Nsight Compute (the second launch of each is the one to profile: the first pays for loading).

    ncu -k regex:grouped_gemm_kernel --launch-skip 2 --launch-count 2 --import-source yes \\
        --section SpeedOfLight --section WarpStateStats --section SourceCounters \\
        -o fc1_fc2 python scripts/ncu_engine.py qwen3_30b_a3b_like 8 8192
"""

import argparse

import torch

from bench_gemm import grouped_problem
from mok_megatron import ops
from mok_megatron.config import load_model


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("local_experts", type=int)
    p.add_argument("tokens", type=int)
    args = p.parse_args(argv)
    model = load_model(args.model)
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    rows = args.tokens * K
    _, offsets, x, w1, w2, prob = grouped_problem(model, args.local_experts, args.tokens, 0)
    act = torch.empty(rows, F, device="cuda", dtype=torch.bfloat16)
    h = torch.empty(rows, 2 * F, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(rows, H, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        ops.grouped_gemm(x, w1, offsets, act, activation="swiglu", row_prob=prob, h_out=h)
        ops.grouped_gemm(act, w2, offsets, y)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
