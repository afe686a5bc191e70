#!/bin/bash
# Session 25, call 3 (one H200): the blockwise FP8 engine's overlapped consumer
# (MOK_FP8_OVERLAP=1: a stage's MMAs as two n64 halves, one promoted while the other runs)
# against the serial one - bits, tests, bench_gemm side by side, the layer with each.
# Everything lands in $OUT/call3.tar.gz.
#   bash benchmarks/results/h200_session25/call3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call3; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_blockwise_kernels.py > $R/pytest_kernels.txt 2>&1
echo "kernel tests: $(tail -1 $R/pytest_kernels.txt)"
grep -B2 -A25 "^___\|Error" $R/pytest_kernels.txt | head -60
MOK_FP8_OVERLAP=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_blockwise_layer.py > $R/pytest_layer_overlap.txt 2>&1
echo "layer tests, overlapped: $(tail -1 $R/pytest_layer_overlap.txt)"
cd scripts
timeout 150 python3 bench_gemm.py --fp8-blockwise --models deepseek_v3_like --variants full ep64 --ep 32 \
  --tokens 4096 --out $R/gemm_overlap_e8.json 2>&1 | tee $R/gemm_overlap_e8.txt | grep -v "^ *$"
timeout 100 python3 bench_gemm.py --fp8-blockwise --models deepseek_v3_like --variants full --ep 1 \
  --tokens 2048 --out $R/gemm_overlap_e256.json 2>&1 | tee $R/gemm_overlap_e256.txt | grep -v "^ *$"
timeout 100 python3 bench_gemm.py --fp8-blockwise --models qwen3_30b_a3b_like mok_bench --variants ep64 \
  --tokens 4096 --out $R/gemm_overlap_small.json 2>&1 | tee $R/gemm_overlap_small.txt | grep -v "^ *$"
cd ..
for ov in 0 1; do
  MOK_FP8_OVERLAP=$ov timeout 150 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
    --models deepseek_v3_like --variants ep64 --tokens 4096 --iters 5 --warmup 2 \
    --out $R/layer_overlap$ov > $R/layer_overlap$ov.txt 2>&1
  echo "layer, MOK_FP8_OVERLAP=$ov:"; grep -A4 "^deepseek" $R/layer_overlap$ov.txt | cut -c1-230
done
tar czf $OUT/call3.tar.gz -C /tmp call3
