#!/bin/bash
# Session 22, call 6 (one H200): a second sample of the forward megakernel's figures with
# fewer paths in the run (call 5: a run's other paths moved the separate codes path by 16%):
# BF16 separate, the BF16 forward megakernel and mxfp8 on the forward megakernel (auto's
# form), DeepSeek and Qwen, both variants. Output: $OUT.
#   bash benchmarks/results/h200_mxfp8_megakernel/run6.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for m in deepseek_v3_like:150 qwen3_30b_a3b_like:100; do
  timeout ${m#*:} torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8-megakernel \
    --models ${m%:*} --tokens 2048 4096 --iters 7 --warmup 2 \
    --out $OUT/bench_${m%%_*} > $OUT/bench_${m%%_*}.txt 2>&1
  grep -A2 "^${m%%_*}" $OUT/bench_${m%%_*}.txt | grep -v "peak memory" | cut -c1-230
done
(cd $OUT && tar czf results.tgz bench_* && rm -rf bench_*)
