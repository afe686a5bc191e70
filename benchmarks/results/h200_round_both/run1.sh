#!/bin/bash
# Session 21, call 1 (one H200): backward's operands in both of their recipe's forms from one
# pass (csrc/quant/mx_round_both.cu). The GPU tests of every file the change touches.
# Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_round_both/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_fp8_dispatch:60 test_fp8_blockwise_kernels:60 test_mxfp8_kernels:170 \
            test_fp8_blockwise_layer:120 test_symm_moe:120; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
  [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_$f.txt | head -12
done
(cd $OUT && tar czf results.tgz pytest_*.txt && rm -f pytest_*.txt)
