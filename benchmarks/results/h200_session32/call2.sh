#!/bin/bash
# Session 32, call 2 (one GPU; written, not run: no machine could be started after call 1).
# (1) Where the Qwen ep64 forward goes per kernel under the four settings (call 1: the
# blockwise forward megakernel 0.92 ms in a CUDA graph against the BF16 forward megakernel's
# 0.71), from profile_recipes; and its GEMMs alone against our BF16 engine and
# torch._scaled_mm (bench_gemm; session 18 on an H200: the FP8 GEMMs only 1.03-1.11x our BF16
# engine at this shape). (2) bench_moe at the MoK EP64-equivalent, T=4096, synchronized,
# --streamed and --cuda-graph, with the captured fwd+bwd on leaves of its own (call 1's BF16
# capture failed, cudaErrorStreamCaptureImplicit). $OUT/call2.tar.gz after every step.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/results/h200_session32/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call2.tar.gz -C /tmp call2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
timeout 90 python3 benchmarks/diagnostics/profile_recipes.py --model qwen3_30b_a3b_like \
  --variant ep64 --top 14 --out $R/profile_qwen_ep64.json > $R/profile_qwen_ep64.txt 2>&1
echo "profile qwen ep64 rc $?"; cut -c1-150 $R/profile_qwen_ep64.txt | head -90
save
(cd scripts && timeout 60 python3 bench_gemm.py --fp8-blockwise --models qwen3_30b_a3b_like \
  --variants ep64 --tokens 4096 --out $R/gemm_qwen_ep64.json > $R/gemm_qwen_ep64.txt 2>&1)
echo "bench_gemm qwen ep64 rc $?"; grep -A4 "^qwen" $R/gemm_qwen_ep64.txt | cut -c1-250
save
timeout 150 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --streamed --cuda-graph --models mok_bench --variants ep64 \
  --tokens 4096 --iters 5 --warmup 2 --out $R/bench_mok_ep64 > $R/bench_mok_ep64.txt 2>&1
echo "bench rc $?"
grep -A7 -E "^(deepseek|mok|qwen)" $R/bench_mok_ep64.txt | grep -v "kept from\|peak memory" | cut -c1-400
grep "graph failed" $R/bench_mok_ep64.txt | cut -c1-200
save
