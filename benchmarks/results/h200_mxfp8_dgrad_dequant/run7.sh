#!/bin/bash
# Session 20, call 7 (one H200): branch mxfp8-convert-loads-first - the dequantizing engine
# loads every pass's codes and scale codes before converting the first. Its tests, the
# MXFP8 GEMMs (bench_gemm --mxfp8: forward and dgrads next to our BF16 engine and torch) and
# the layer with codes next to BF16 on DeepSeek-V3-like shapes.
# Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_mxfp8_dgrad_dequant/run7.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mxfp8_kernels.py > $OUT/pytest_test_mxfp8_kernels.txt 2>&1
echo "test_mxfp8_kernels: $(tail -n 1 $OUT/pytest_test_mxfp8_kernels.txt) [rc $?]"
timeout 100 python3 scripts/bench_gemm.py --mxfp8 --models deepseek_v3_like qwen3_30b_a3b_like \
  --ep 1 --variants full ep64 --tokens 4096 --iters 10 --out $OUT/gemm_mxfp8.json > $OUT/gemm_mxfp8.txt 2>&1
grep -v "^W1\|warn" $OUT/gemm_mxfp8.txt | cut -c1-230 | tail -12
timeout 170 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --mxfp8-weights codes \
  --models deepseek_v3_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_deepseek > $OUT/bench_deepseek.txt 2>&1
grep -A1 "^deepseek" $OUT/bench_deepseek.txt | cut -c1-220
