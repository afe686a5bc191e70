#!/bin/bash
# Session 26, call 2 (one H200), branch s26-combined: the FP8 SS wgmma's rate alone
# (benchmarks/probes/fp8_wgmma_probe.cu: the blockwise engine's per-stage MMAs over resident
# stages; with promotion; as n64 halves; as m64n256; beside 32 KB of bulk writes per stage -
# near 1400 TF/s the loads cost the engine its rate, near 740 the SS form is the cap), then
# the layer under bf16 and fp8_blockwise on the separate kernels and on the forward megakernel
# (next to the BF16 forward megakernel): DeepSeek-V3-like E=8 (ep64) and E=256 (full) and
# Qwen3 E=8 (ep64) at 4096 tokens. $OUT/call2.tar.gz, rewritten after every step.
#   bash benchmarks/results/h200_session26/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; mkdir -p $R
save() { tar czf $OUT/call2.tar.gz -C /tmp call2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc -o /tmp/fp8_probe \
  benchmarks/probes/fp8_wgmma_probe.cu > $R/probe_build.txt 2>&1 && timeout 60 /tmp/fp8_probe \
  > $R/probe.txt 2>&1
echo "probe rc $?"; tail -n 12 $R/probe.txt
save
for case in "deepseek_v3_like ep64 180" "deepseek_v3_like full 180" "qwen3_30b_a3b_like ep64 110"; do
  set -- $case
  timeout $3 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
    --fp8-blockwise-megakernel --models $1 --variants $2 --tokens 4096 --iters 5 \
    --warmup 2 --out $R/bench_$1_$2 > $R/bench_$1_$2.txt 2>&1
  echo "bench $1 $2 rc $?"; grep -A8 "^${1%%_*}" $R/bench_$1_$2.txt | grep -v "kept from" | cut -c1-230
  save
done
