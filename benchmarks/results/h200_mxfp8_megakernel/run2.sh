#!/bin/bash
# Session 22, call 2 (one H200): the weight-code conversion without a branch per pass (call 1's
# conversion ran 15% slower than the F2FP one it replaced). test_mxfp8_kernels, the engine's
# GEMMs on DeepSeek's per-GPU shapes (bench_gemm.py --mxfp8: codes, rounded, BF16), then the
# layer (run1.sh's paths) on DeepSeek and Qwen with both weight forms. Output: $OUT.
#   bash benchmarks/results/h200_mxfp8_megakernel/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
here=benchmarks/results/h200_mxfp8_megakernel
timeout 120 python3 scripts/bench_gemm.py --mxfp8 --models deepseek_v3_like --ep 1 \
  --tokens 2048 4096 --iters 10 --out $OUT/gemm_deepseek.json > $OUT/gemm_deepseek.txt 2>&1
echo "bench_gemm rc $?"; grep -v "^W1\|warn" $OUT/gemm_deepseek.txt | tail -30 | cut -c1-200
TESTS="test_mxfp8_kernels:150" MODELS="deepseek_v3_like:200 qwen3_30b_a3b_like:150" \
  FORMS="codes rounded" bash $here/run1.sh
(cd $OUT && tar czf gemm.tgz gemm_deepseek.*  && rm -f gemm_deepseek.*)
