#!/bin/bash
# Session 27, call 1 (one H200), branch blockwise-backward-megakernel (session 26's
# s26-combined - the forward megakernel under fp8_blockwise and quant-div32 - plus the backward
# megakernel under the recipe and the FP8 GEMM's warpgroup turns): both blockwise megakernels
# against the blockwise reference, the forward one bit for bit the separate path, the backward
# one against the separate backward; settings, graph replay, the emulated EP=2/4 group, the
# launch's refusals (test_fp8_blockwise_layer -k megakernel); the FP8 grouped GEMM with and
# without turns and the both-forms pass (its unit moved); then bench_gemm: the quantizer's time
# (session 25: 0.49 ms for 32768 x 7168; quant-div32 predicted 0.2-0.3 ms), the blockwise GEMM
# with turns, and next to cuBLAS's blockwise GEMM on the same dense problem.
# $OUT/call1.tar.gz, rewritten after every step (a call stopped at its limit keeps what ran).
#   bash benchmarks/results/h200_session27/call1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call1; mkdir -p $R
save() { tar czf $OUT/call1.tar.gz -C /tmp call1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -s -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt) [rc $?]"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run blockwise_backward_mk 220 tests/gpu/test_fp8_blockwise_layer.py -k backward_megakernel
run blockwise_forward_mk 120 tests/gpu/test_fp8_blockwise_layer.py -k forward_megakernel
run fp8_gemm 60 tests/gpu/test_fp8_blockwise_kernels.py -k "grouped_gemm or round_both"
(cd scripts && timeout 90 python3 bench_gemm.py --fp8-blockwise --models deepseek_v3_like \
  --variants full --ep 32 --tokens 4096 --out $R/gemm_e8.json > $R/gemm_e8.txt 2>&1)
grep "quantize\|fc1\|fc2\|FC1\|turns" $R/gemm_e8.txt | cut -c1-240 | head -12
save
