#!/bin/bash
# Session 29, call 6 (one GPU, the device time left): the Qwen3-30B-A3B-like layer (full experts
# and its EP64-equivalent, T=4096) under bf16 and fp8_blockwise (separate, forward megakernel) -
# the "no shape slower than our BF16" on this session's consumer. $OUT/call6.tar.gz.
#   bash benchmarks/results/h200_session29/call6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call6; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
timeout 200 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --models qwen3_30b_a3b_like --variants full ep64 \
  --tokens 4096 --iters 5 --warmup 2 --out $R/bench_qwen > $R/bench_qwen.txt 2>&1
echo "bench qwen rc $?"
grep -A3 -E "^qwen" $R/bench_qwen.txt | grep -v "kept from" | cut -c1-230
tar czf $OUT/call6.tar.gz -C /tmp call6
