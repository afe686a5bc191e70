#!/bin/bash
# Session 25, call 4 (one H200), branch quant-ilp: the columns quantizer with 4 vectors in
# flight per lane - its tests and its time (bench_gemm's quantize x / act) - then the
# DeepSeek-V3-like layer under bf16, mxfp8 (separate kernels; and on the forward megakernel)
# and fp8_blockwise, E=256 and E=8 at 2048 and 4096 tokens, one run: the figures issues 17
# and 19 close on. $OUT/call4.tar.gz.
#   bash benchmarks/results/h200_session25/call4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call4; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_mxfp8_kernels.py \
  tests/gpu/test_fp8_blockwise_kernels.py tests/gpu/test_fp8_dispatch.py > $R/pytest_quant.txt 2>&1
echo "quantizer tests: $(tail -1 $R/pytest_quant.txt)"
(cd scripts && timeout 60 python3 bench_gemm.py --fp8-blockwise --models deepseek_v3_like \
  --variants full --ep 32 --tokens 4096 --out $R/gemm_e8.json > $R/gemm_e8.txt 2>&1)
grep "quantize" $R/gemm_e8.txt | cut -c1-200
timeout 330 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --mxfp8-megakernel --fp8-blockwise \
  --models deepseek_v3_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $R/bench_deepseek > $R/bench_deepseek.txt 2>&1
echo "bench rc $?"; grep -v "^W1\|warn" $R/bench_deepseek.txt | cut -c1-250 | tail -44
tar czf $OUT/call4.tar.gz -C /tmp call4
