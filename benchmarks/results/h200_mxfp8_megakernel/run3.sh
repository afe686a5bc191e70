#!/bin/bash
# Session 22, call 3 (one H200): main after reverting the weight-code conversion to F2FP (the
# bit conversion was no faster, calls 1-2) and auto's weight form moved to rounded from 128
# rows per local expert. The GPU tests the session's changes touch, the 100-step Megatron run
# under mxfp8 on the forward megakernel, then the layer's figures (auto's form; BF16 separate,
# BF16 forward megakernel, mxfp8 separate and on the forward megakernel) on DeepSeek and Qwen.
#   bash benchmarks/results/h200_mxfp8_megakernel/run3.sh
set -u
here=benchmarks/results/h200_mxfp8_megakernel
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
timeout 150 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_megatron_fp8_training.py \
  -k megakernel > $OUT/pytest_test_megatron_fp8_training.txt 2>&1
rc=$?
echo "test_megatron_fp8_training -k megakernel: $(tail -n 1 $OUT/pytest_test_megatron_fp8_training.txt) [rc $rc]"
grep "max relative loss" $OUT/pytest_test_megatron_fp8_training.txt
TESTS="test_mxfp8_kernels:150 test_symm_moe:60 test_fp8_dispatch:60 test_fp8_blockwise_layer:60 test_emulated_ep:100" \
  MODELS="deepseek_v3_like:150 qwen3_30b_a3b_like:120" FORMS=auto bash $here/run1.sh
(cd $OUT && tar czf training.tgz pytest_test_megatron_fp8_training.txt && rm -f pytest_test_megatron_fp8_training.txt)
