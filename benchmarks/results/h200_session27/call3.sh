#!/bin/bash
# Session 27, call 3 (one H200), branch blockwise-backward-megakernel: the layer under bf16 and
# fp8_blockwise on the separate kernels, the forward megakernel and both megakernels, next to
# BF16's megakernels, at 4096 tokens: the EP64-equivalents of DeepSeek-V3 and MoK's bench model
# (the targets), then DeepSeek's full experts. Predictions: docs/perf-log.md
# "Session 27". $OUT/call3.tar.gz, rewritten after every step.
#   bash benchmarks/results/h200_session27/call3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call3; mkdir -p $R
save() { tar czf $OUT/call3.tar.gz -C /tmp call3; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
for case in "ep64 330 deepseek_v3_like mok_bench" "full 220 deepseek_v3_like"; do
  set -- $case
  variant=$1 limit=$2; shift 2
  timeout $limit torchrun --nproc-per-node 1 scripts/bench_moe.py --megakernel --fp8-blockwise \
    --fp8-blockwise-megakernel --fp8-blockwise-megakernels --models "$@" --variants $variant \
    --tokens 4096 --iters 5 --warmup 2 --out $R/bench_$variant > $R/bench_$variant.txt 2>&1
  echo "bench $variant rc $?"
  grep -A9 -E "^(deepseek|mok_bench)" $R/bench_$variant.txt | grep -v "kept from" | cut -c1-230
  save
done
