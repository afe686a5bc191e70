#!/bin/bash
# Session 31, call 1 (one GPU): main's tree - where a synchronized call's wall time goes that
# its kernels do not cover (benchmarks/diagnostics/timeline.py: every GPU activity with its
# host launch time and the idle gap before it, and the host ops in each gap), DeepSeek and Qwen
# EP64-equivalents at T=4096, bf16 separate against fp8_blockwise on both forward kernels;
# then the same with the Python functions (--stack) for the blockwise megakernel.
# $OUT/call1.tar.gz after every step.
#   bash benchmarks/results/h200_session31/call1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call1.tar.gz -C /tmp call1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
for m in deepseek_v3_like qwen3_30b_a3b_like; do
  timeout 150 python3 benchmarks/diagnostics/timeline.py --model $m --variant ep64 \
    --settings "bf16 separate" "fp8_blockwise separate" "fp8_blockwise megakernel" \
    --out $R/timeline_${m}.json > $R/timeline_${m}.txt 2>&1
  echo "timeline $m rc $?"; grep -E "wall" $R/timeline_${m}.txt | cut -c1-200
  save
done
timeout 120 python3 benchmarks/diagnostics/timeline.py --model deepseek_v3_like --variant ep64 \
  --settings "bf16 separate" "fp8_blockwise megakernel" --stack --top-ops 14 \
  --out $R/timeline_stack_deepseek.json > $R/timeline_stack_deepseek.txt 2>&1
echo "timeline stack rc $?"; grep -E "wall" $R/timeline_stack_deepseek.txt | cut -c1-200
save
