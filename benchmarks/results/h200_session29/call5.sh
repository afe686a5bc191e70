#!/bin/bash
# Session 29, call 5 (one GPU): the recipe trains end to end on this session's consumer -
# Megatron's pretrain loop, 100 steps of tiny's GPT-MoE (F = 64) under fp8_blockwise against
# bf16 (test_megatron_fp8_training, the 2%-at-every-logged-step bound). $OUT/call5.tar.gz.
#   bash benchmarks/results/h200_session29/call5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call5; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
timeout 420 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_megatron_fp8_training.py \
  -k fp8_blockwise > $R/pytest_megatron_fp8_blockwise.txt 2>&1
echo "megatron fp8_blockwise: $(tail -n 1 $R/pytest_megatron_fp8_blockwise.txt) [rc $?]"
grep -iE "relative|largest|step|passed|failed" $R/pytest_megatron_fp8_blockwise.txt | tail -8 | cut -c1-200
tar czf $OUT/call5.tar.gz -C /tmp call5
