#!/bin/bash
# Session 28, call 6 (one H200, the device time left): the layer under bf16 and fp8_blockwise
# (separate, forward megakernel) at the DeepSeek-V3 EP64-equivalent, 4096 tokens - the issue's
# figure on the merged main. $OUT/call6.tar.gz.
#   bash benchmarks/results/h200_session28/call6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call6; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
timeout 170 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --models deepseek_v3_like --variants ep64 \
  --tokens 4096 --iters 5 --warmup 2 --out $R/bench_ep64 > $R/bench_ep64.txt 2>&1
echo "bench ep64 rc $?"
grep -A6 -E "^deepseek" $R/bench_ep64.txt | grep -v "kept from" | cut -c1-230
tar czf $OUT/call6.tar.gz -C /tmp call6
