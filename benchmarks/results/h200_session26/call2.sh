#!/bin/bash
# Session 26, call 2 (one H200), branch s26-combined: the FP8 SS wgmma's rate alone
# (benchmarks/probes/fp8_wgmma_probe.cu: the blockwise engine's per-stage MMAs over resident
# stages; with promotion; as n64 halves; as m64n256; beside 32 KB of bulk writes per stage -
# near 1400 TF/s the loads cost the engine its rate, near 740 the SS form is the cap), then
# the layer under bf16 and fp8_blockwise on the separate kernels and on the forward megakernel
# (next to the BF16 forward megakernel) at 4096 tokens: the EP64-equivalents of DeepSeek-V3,
# MoK's bench model and Qwen3, and DeepSeek's full experts. $OUT/call2.tar.gz, rewritten after
# every step.
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
# The EP64-equivalents (the DeepSeek and MoK targets, Qwen's below-BF16 case) in one
# process, then DeepSeek's full experts.
for case in "ep64 300 deepseek_v3_like mok_bench qwen3_30b_a3b_like" "full 170 deepseek_v3_like"; do
  set -- $case
  variant=$1 limit=$2; shift 2
  timeout $limit torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
    --fp8-blockwise-megakernel --models "$@" --variants $variant --tokens 4096 --iters 5 \
    --warmup 2 --out $R/bench_$variant > $R/bench_$variant.txt 2>&1
  echo "bench $variant rc $?"
  grep -A8 -E "^(deepseek|mok_bench|qwen3)" $R/bench_$variant.txt | grep -v "kept from" | cut -c1-230
  save
done
