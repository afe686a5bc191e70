#!/bin/bash
# Session 21, call 7 (one H200): why MXFP8's fwd+bwd at DeepSeek E=8 T=2048 stays at 0.87-0.94x
# while T=4096 reached 0.98: per-kernel backward profiles at T=2048 under bf16 and mxfp8.
# Output: $OUT. Run from the repository root with the extension built (here: CI's build of
# main at 4704960):   bash benchmarks/results/h200_round_both/run7.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for p in bf16 mxfp8; do
  timeout 60 python3 scripts/profile_backward.py --model deepseek_v3_like --variant ep64 \
    --tokens 2048 --precision $p --out $OUT/profile_backward_${p}_ds_e8_t2048.json > $OUT/profile_backward_${p}_t2048.txt 2>&1
  grep -v "^W1\|warn" $OUT/profile_backward_${p}_t2048.txt | grep -A12 "separate" | head -14
done
