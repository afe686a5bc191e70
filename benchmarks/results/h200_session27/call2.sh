#!/bin/bash
# Session 27, call 2 (one H200), branch blockwise-backward-megakernel: the rest of the
# blockwise layer's tests and its quantizers, then what the two sessions' refactors touch - the
# BF16 backward megakernel and forward megakernel, the MXFP8 megakernels (BackwardOrder,
# tile_needs, the FC2-dgrad epilogue's template, the pull and storer's Fp8Rows).
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
run blockwise_rest 120 tests/gpu/test_fp8_blockwise_layer.py -k "not megakernel"
run quant 80 tests/gpu/test_fp8_blockwise_kernels.py tests/gpu/test_fp8_dispatch.py -k "not grouped_gemm and not round_both"
run bf16_backward_mk 130 tests/gpu/test_backward_megakernel.py
run mx_megakernels 130 tests/gpu/test_mxfp8_kernels.py -k megakernel
run bf16_megakernel 90 tests/gpu/test_megakernel.py
