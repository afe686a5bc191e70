#!/bin/bash
# The third call on one H200 (session 18): where the blockwise fwd+bwd lost time after the FP8
# wgrad went in - the two blockwise wgrads side by side (benchmarks/probes/blockwise_wgrad.py)
# and the backward per kernel, bf16 against fp8_blockwise (scripts/profile_backward.py).
# The probe was removed with the FP8 wgrad after this call: it lives at commit 70ac3b5.
# Output: $OUT (call3/ here). Run from the repository root:
#   bash benchmarks/results/h200_fp8_dispatch/run_wgrad.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
timeout 120 python3 benchmarks/probes/blockwise_wgrad.py 2>&1 | tee $OUT/blockwise_wgrad.txt | grep -v Warn
for v in ep64 full; do for p in bf16 fp8_blockwise; do
  timeout 90 python3 scripts/profile_backward.py --model deepseek_v3_like --variant $v --tokens 4096 --precision $p --iters 3 --out $OUT/profile_${v}_$p.json 2>&1 | grep -v "Warn\|warn" | tee -a $OUT/profile_backward.txt
done; done
