#!/bin/bash
# Session 27, call 2 (one H200), branch blockwise-backward-megakernel: what the two sessions'
# refactors touch - the BF16 backward megakernel and forward megakernel, the MXFP8 megakernels
# (BackwardOrder, tile_needs, the FC2-dgrad epilogue's template, the pull and storer's Fp8Rows)
# - then the quantizer's time (bench_gemm quantize x / act; session 25: 0.49 ms for 32768 x
# 7168; quant-div32 predicted 0.2-0.3 ms) and the blockwise GEMM on a dense problem next to
# cuBLAS's blockwise GEMM (the same recipe: is ~740 TF/s our engine's cap or the recipe's?) and
# with the warpgroups taking turns on the tensor cores (ops.fp8_grouped_gemm warpgroup_turns).
#   bash benchmarks/results/h200_session27/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; mkdir -p $R
save() { tar czf $OUT/call2.tar.gz -C /tmp call2; }
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt) [rc $?]"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run bf16_backward_mk 150 tests/gpu/test_backward_megakernel.py
run mx_megakernels 170 tests/gpu/test_mxfp8_kernels.py -k "megakernel or quantize or round or columns or segment"
run bf16_megakernel 100 tests/gpu/test_megakernel.py
(cd scripts && timeout 90 python3 bench_gemm.py --fp8-blockwise --models deepseek_v3_like \
  --variants full --ep 32 --tokens 4096 --out $R/gemm_e8.json > $R/gemm_e8.txt 2>&1)
grep "quantize\|fc1\|fc2\|FC1\|turns" $R/gemm_e8.txt | cut -c1-240 | head -12
save
