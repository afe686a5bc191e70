#!/bin/bash
# Session 26, call 1 (one H200), branch s26-combined (blockwise-megakernel + quant-div32): the
# forward megakernel under fp8_blockwise (csrc/megakernel/moe_forward.cu kFp8Blockwise) against
# the blockwise reference and bit for bit the separate path, its settings, graph replay and the
# emulated EP=2/4 group (test_fp8_blockwise_layer); what its refactors touch - the MXFP8 and
# BF16 forward megakernels (pull_wire_rows, activate_rows), the FP8 grouped GEMM (its ring
# templated on the stage count), the quantizers (quant-div32's 32-bit divisions). Then the
# quantizer's time (bench_gemm quantize x / act; session 25: 0.49 ms for 32768 x 7168).
# $OUT/call1.tar.gz, rewritten after every step (a call stopped at its limit keeps what ran).
#   bash benchmarks/results/h200_session26/call1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call1; mkdir -p $R
save() { tar czf $OUT/call1.tar.gz -C /tmp call1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt) [rc $?]"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run blockwise 190 tests/gpu/test_fp8_blockwise_layer.py
run quant 100 tests/gpu/test_fp8_blockwise_kernels.py tests/gpu/test_fp8_dispatch.py
run mx_megakernel 120 tests/gpu/test_mxfp8_kernels.py -k "forward_megakernel or quantize or round or columns or segment"
run bf16_megakernel 100 tests/gpu/test_megakernel.py
(cd scripts && timeout 40 python3 bench_gemm.py --fp8-blockwise --models deepseek_v3_like \
  --variants full --ep 32 --tokens 4096 --out $R/gemm_e8.json > $R/gemm_e8.txt 2>&1)
grep "quantize\|fc1\|fc2" $R/gemm_e8.txt | cut -c1-200 | head -12
save
