#!/bin/bash
# Session 17's changes on one H200 (written in session 17, which had no device time; not yet
# run): FP8 rows on the wire for both FP8 recipes, MXFP8's FC2 on the dequantizing engine,
# the blockwise GEMM's promotion as one FFMA per accumulator, the blockwise FP8 wgrad, and a
# probe for the next MXFP8 engine.
# Output: $OUT (pytest logs, bench text, JSON in one tar). Run from the repository root:
#   bash benchmarks/results/h200_fp8_dispatch/run.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
# 0. The probe for the next MXFP8 engine (docs/fp8-plan.md): A from registers, converted.
timeout 50 bash -c "nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
  -o /tmp/rs_probe benchmarks/probes/rs_wgmma_probe.cu && /tmp/rs_probe" > $OUT/rs_probe.txt 2>&1
cat $OUT/rs_probe.txt
# 1. The wire itself: publish + pull bit-exact against quantizing the pulled rows.
timeout 60 python3 -m pytest -q -x tests/gpu/test_fp8_dispatch.py 2>&1 | tail -15 > $OUT/pytest_dispatch.txt
cat $OUT/pytest_dispatch.txt
# 2. Both recipes' layer suites (recomputed-vs-saved compares the two wires bit for bit).
timeout 170 python3 -m pytest -q tests/gpu/test_mxfp8_kernels.py tests/gpu/test_fp8_blockwise_kernels.py \
  tests/gpu/test_fp8_blockwise_layer.py tests/gpu/test_symm_moe.py 2>&1 | tail -25 > $OUT/pytest_recipes.txt
tail -8 $OUT/pytest_recipes.txt
# 3. The FP8 GEMMs next to our BF16 engine and torch._scaled_mm (the blockwise promotion as one
#    FFMA per accumulator: perf-log session 17).
timeout 90 python3 scripts/bench_gemm.py --mxfp8 --fp8-blockwise --models deepseek_v3_like qwen3_30b_a3b_like \
  --ep 1 --variants full ep64 --tokens 4096 --iters 10 --out $OUT/gemm_fp8.json > $OUT/gemm_fp8.txt 2>&1
cut -c1-260 $OUT/gemm_fp8.txt | tail -12
# 4. The layer next to BF16 and alltoall, dispatch bytes per path.
timeout 140 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --fp8-blockwise \
  --models deepseek_v3_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_deepseek > $OUT/bench_deepseek.txt 2>&1
grep -v "^W1\|warn" $OUT/bench_deepseek.txt | tail -24 | cut -c1-220
timeout 80 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --fp8-blockwise \
  --models qwen3_30b_a3b_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_qwen > $OUT/bench_qwen.txt 2>&1
grep -v "^W1\|warn" $OUT/bench_qwen.txt | tail -24 | cut -c1-220
cd $OUT && tar cf bench_json.tar bench_deepseek bench_qwen gemm_fp8.json && rm -rf bench_deepseek bench_qwen gemm_fp8.json
