#!/bin/bash
# Session 21, call 2 (one H200): per-kernel backward profiles at DeepSeek E=8 T=4096 under
# bf16, mxfp8 and fp8_blockwise, then the layer under both FP8 recipes next to BF16 on the
# DeepSeek and Qwen bench shapes (weights in auto's form under mxfp8).
# Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_round_both/run2.sh  (MODELS="name:timeout ..." to pick models)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for p in bf16 mxfp8 fp8_blockwise; do
  timeout 60 python3 scripts/profile_backward.py --model deepseek_v3_like --variant ep64 \
    --tokens 4096 --precision $p --out $OUT/profile_backward_${p}_ds_e8.json > $OUT/profile_backward_$p.txt 2>&1
  grep -v "^W1\|warn" $OUT/profile_backward_$p.txt | grep -A12 "separate" | head -14
done
for m in ${MODELS:-deepseek_v3_like:200 qwen3_30b_a3b_like:120}; do
  timeout ${m#*:} torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --fp8-blockwise \
    --models ${m%:*} --tokens 2048 4096 --iters 5 --warmup 2 \
    --out $OUT/bench_${m%%_*} > $OUT/bench_${m%%_*}.txt 2>&1
  grep -A3 "^${m%%_*}" $OUT/bench_${m%%_*}.txt | cut -c1-230
done
(cd $OUT && tar czf results.tgz profile_backward_*.txt bench_* \
  && rm -rf profile_backward_*.txt bench_deepseek bench_qwen3 bench_*.txt)
