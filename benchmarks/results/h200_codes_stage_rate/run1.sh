#!/bin/bash
# Session 23, call 1 (one H200): benchmarks/probes/weight_stream_probe.cu - the engine's stage
# ring alone over DeepSeek E=256 T=2048 FC1's weights (bf16 rows, codes rows, codes stored
# tile-contiguous), ring depth and stages held varied. Output: $OUT/probe.txt.
#   bash benchmarks/results/h200_codes_stage_rate/run1.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc -o /tmp/stream_probe \
  benchmarks/probes/weight_stream_probe.cu && timeout 120 /tmp/stream_probe | tee $OUT/probe.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv >> $OUT/probe.txt
