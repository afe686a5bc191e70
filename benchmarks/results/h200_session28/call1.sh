#!/bin/bash
# Session 28, call 1 (one H200 or H100), branch fp8-ring-depth: the FP8 grouped GEMM's ring
# depth (4/5/6 stages; default now the deepest that fits) and its tile order's m-block groups
# (default 8), the same bits (test_fp8_blockwise_kernels), timed by bench_gemm at DeepSeek E=8
# T=4096 and MoK's bench model at EP64 (predictions: docs/perf-log.md "Session 28"); the
# kernels cuBLAS runs for the same dense problems (tile shape, cluster). $OUT/call1.tar.gz,
# rewritten after every step.
#   bash benchmarks/results/h200_session28/call1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call1; mkdir -p $R
save() { tar czf $OUT/call1.tar.gz -C /tmp call1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_fp8_blockwise_kernels.py \
  -k "grouped_gemm" > $R/pytest_fp8_gemm.txt 2>&1
echo "fp8_gemm: $(tail -n 1 $R/pytest_fp8_gemm.txt)"
grep -E "^(FAILED|ERROR)" $R/pytest_fp8_gemm.txt | head -8 | cut -c1-220
save
for case in "deepseek_v3_like full --ep 32" "mok_bench ep64"; do
  set -- $case
  name=$1_$2
  (cd scripts && timeout 200 python3 bench_gemm.py --fp8-blockwise --models $1 --variants $2 \
    ${3:-} ${4:-} --tokens 4096 --out $R/gemm_$name.json > $R/gemm_$name.txt 2>&1)
  echo "bench_gemm $name rc $?"
  grep -E "FP8 blockwise|same blockwise|ring depth" $R/gemm_$name.txt | cut -c1-250
  save
done
for shape in "32768 4096 7168" "32768 7168 2048"; do
  timeout 60 python3 benchmarks/diagnostics/cublas_kernels.py $shape > $R/cublas_${shape// /_}.txt 2>&1
  cut -c1-200 $R/cublas_${shape// /_}.txt | grep -v Warning | head -12
  save
done
