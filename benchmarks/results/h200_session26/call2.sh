#!/bin/bash
# Session 26, call 2 (one H200), branch s26-combined: the FP8 SS wgmma's rate alone
# (benchmarks/probes/fp8_wgmma_probe.cu: the blockwise engine's per-stage MMAs over resident
# stages - near 1400 TF/s the loads cost the engine its rate, near 740 the SS form is the cap),
# then the DeepSeek-V3-like layer under bf16, fp8_blockwise on the separate kernels and on the
# forward megakernel (next to the BF16 forward megakernel), E=8 (ep64) and E=256 (full) at 4096
# tokens, one run. $OUT/call2.tar.gz.
#   bash benchmarks/results/h200_session26/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc -o /tmp/fp8_probe \
  benchmarks/probes/fp8_wgmma_probe.cu > $R/probe_build.txt 2>&1 && timeout 60 /tmp/fp8_probe \
  > $R/probe.txt 2>&1
echo "probe rc $?"; tail -n 12 $R/probe.txt
for shape in "ep64 4096" "full 4096"; do
  set -- $shape
  timeout 200 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
    --fp8-blockwise-megakernel --models deepseek_v3_like --variants $1 --tokens $2 --iters 5 \
    --warmup 2 --out $R/bench_$1_$2 > $R/bench_$1_$2.txt 2>&1
  echo "bench $1 $2 rc $?"; grep -A8 "^deepseek" $R/bench_$1_$2.txt | grep -v "kept from" | cut -c1-230
done
tar czf $OUT/call2.tar.gz -C /tmp call2
