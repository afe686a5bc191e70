#!/bin/bash
# Session 34, call 4 (one GPU): the GPU test files not yet run on fbafef6's kernels (call 2 ran
# the blockwise layer, megakernel, emulated-EP and backward-megakernel files on them: 220
# passed), for SUITE_S seconds. The extension carried is fbafef6's build (call 2's).
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/results/h200_session34/call4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call4; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
FILES="${FILES:-test_fp8_blockwise_kernels test_megatron_fp8_training test_fp8_dispatch test_failures test_megatron_graph_replay test_megatron_moe_layer_vs_reference test_symm_moe test_grouped_gemm test_schedule test_mxfp8_kernels}"
timeout ${SUITE_S:-250} python3 -m pytest -v -rfE -p no:cacheprovider \
  $(for f in $FILES; do echo tests/gpu/$f.py; done) > $R/pytest_gpu.txt 2>&1
echo "pytest rc $?"; grep -c PASSED $R/pytest_gpu.txt; grep -E "FAILED|ERROR" $R/pytest_gpu.txt | head; tail -2 $R/pytest_gpu.txt
tar czf $OUT/call4.tar.gz -C /tmp call4
