"""One engine FC1 (SwiGLU x prob, writing h) and one FC2 on a bench_gemm shape, twice, for
Nsight Compute (the second launch of each is the one to profile: the first pays for loading).
--engine: the BF16 tile engine (bf16), the same engine on MXFP8 weight codes dequantized in
shared memory (mxfp8_dequant, activations MXFP8-rounded), or the FP8 engine under the blockwise
recipe (blockwise), on operands quantized beforehand.

    ncu -k regex:grouped_gemm_kernel --launch-skip 2 --launch-count 2 --import-source yes \\
        --section SpeedOfLight --section WarpStateStats --section SourceCounters \\
        -o fc1_fc2 python benchmarks/diagnostics/ncu_engine.py qwen3_30b_a3b_like 8 8192
"""

import argparse
import sys
from pathlib import Path

# Run from anywhere: the repository (mok_megatron) and scripts/ (the benchmarks' helpers).
REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import torch  # noqa: E402

from bench_gemm import grouped_problem  # noqa: E402
from mok_megatron.cuda import ops  # noqa: E402
from mok_megatron.config import load_model  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("local_experts", type=int)
    p.add_argument("tokens", type=int)
    p.add_argument("--engine", default="bf16", choices=["bf16", "mxfp8_dequant", "blockwise"])
    args = p.parse_args(argv)
    model = load_model(args.model)
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    rows = args.tokens * K
    _, offsets, x, w1, w2, prob = grouped_problem(model, args.local_experts, args.tokens, 0)
    act = torch.empty(rows, F, device="cuda", dtype=torch.bfloat16)
    h = torch.empty(rows, 2 * F, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(rows, H, device="cuda", dtype=torch.bfloat16)
    if args.engine == "bf16":
        def fc1():
            ops.grouped_gemm(x, w1, offsets, act, activation="swiglu", row_prob=prob, h_out=h)

        def fc2():
            ops.grouped_gemm(act, w2, offsets, y)
    elif args.engine == "mxfp8_dequant":
        from mok_megatron.cuda.mxfp8_weights import quantize_weight

        q1, q2 = quantize_weight(w1, halves=2), quantize_weight(w2)
        x_r = ops.mx_round_columns(x)

        def fc1():
            ops.grouped_gemm(x_r, q1.codes, offsets, act, activation="swiglu", row_prob=prob,
                             h_out=h, w_scales=q1.scales)

        def fc2():
            ops.grouped_gemm(act, q2.codes, offsets, y, w_scales=q2.scales)
    else:
        w1_q, w2_q = ops.fp8_quantize_weight_blocks(w1), ops.fp8_quantize_weight_blocks(w2)
        x_q = ops.fp8_quantize_rows(x, block=ops.FP8_BLOCK)
        act_q = ops.fp8_quantize_rows(act, block=ops.FP8_BLOCK)

        def fc1():
            ops.fp8_grouped_gemm(*x_q, *w1_q, offsets, act, activation="swiglu", row_prob=prob,
                                 h_out=h)

        def fc2():
            ops.fp8_grouped_gemm(*act_q, *w2_q, offsets, y)
    for _ in range(2):
        fc1()
        fc2()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
