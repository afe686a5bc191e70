#!/bin/bash
# Session 32, call 3 (one GPU, the ~50 s of device time left after a start): call 2's first
# step alone - where the Qwen ep64 forward goes per kernel under the BF16 and blockwise forward
# megakernels and the blockwise separate path (profile_recipes). $OUT/call3.tar.gz.
#   PYTHONPATH=$PWD bash benchmarks/results/h200_session32/call3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call3.tar.gz -C /tmp call3; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
save
timeout 50 python3 benchmarks/diagnostics/profile_recipes.py --model qwen3_30b_a3b_like \
  --variant ep64 --settings "bf16 megakernel" "fp8_blockwise megakernel" \
  "fp8_blockwise separate" --iters 3 --top 12 --out $R/profile_qwen_ep64.json \
  > $R/profile_qwen_ep64.txt 2>&1
echo "profile qwen ep64 rc $?"; cut -c1-150 $R/profile_qwen_ep64.txt | head -70
save
