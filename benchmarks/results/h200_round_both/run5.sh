#!/bin/bash
# Session 21, call 5 (one H200): Megatron's training loop under both FP8 recipes against bf16
# (100 steps, within 2% at every logged step) on the session's final build, and the GPU test
# files call 4 did not run that exercise the changed row movers and rounding kernels.
# Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_round_both/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_megatron_fp8_training:260 test_emulated_ep:120 test_failures:80 test_grouped_gemm:60; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -s -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
  [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_$f.txt | head -12
done
grep -h "max relative\|relative loss\|loss" $OUT/pytest_test_megatron_fp8_training.txt | tail -6
(cd $OUT && tar czf results.tgz pytest_*.txt && rm -f pytest_*.txt)
