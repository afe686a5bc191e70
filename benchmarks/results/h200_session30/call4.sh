#!/bin/bash
# Session 30, call 4 (one GPU, the device time left): main's tree (call 3's) - where the DeepSeek
# and MoK EP64-equivalent layers' time goes per recipe (profile_recipes: one training forward
# and its backward per kernel, T=4096), for the fwd+bwd target's reason. $OUT/call4.tar.gz.
#   bash benchmarks/results/h200_session30/call4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call4; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call4.tar.gz -C /tmp call4; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
for m in deepseek_v3_like mok_bench; do
  timeout 110 python3 benchmarks/diagnostics/profile_recipes.py --model $m --variant ep64 \
    --settings "bf16 separate" "fp8_blockwise separate" "fp8_blockwise megakernel" --top 14 \
    --out $R/profile_${m}_ep64.json > $R/profile_${m}_ep64.txt 2>&1
  echo "profile $m rc $?"; grep -E "us, kernels" $R/profile_${m}_ep64.txt | cut -c1-140
  save
done
