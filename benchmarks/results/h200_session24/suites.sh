#!/bin/bash
# Branch s24-combined (one H200): every GPU suite the four GPU-untested branches touch, in one
# call (the prefetch off: its default), before any timing - l2-prefetch (the engine's and both
# megakernels' producers), fp8-wire-megakernel (the forward megakernel's FP8 wire pull, the
# dequantizer moved), mx-backward-megakernel (the backward megakernel under MXFP8, its BF16
# waits as one table, the both-forms pass's arithmetic moved), fp8-saved-rows (saved rows as
# codes under both FP8 recipes). Suites of ~6 minutes in all at their last runs. Output: $OUT.
#   bash benchmarks/results/s24_combined/suites.sh
# Then the timing calls: h200_codes_stage_rate/run2.sh (prefetch distances), then
# h200_mxfp8_backward_megakernel/run1.sh with TESTS="" (its bench only), h200_wire_megakernel's
# bench, each with MOK_PREFETCH at the distance run2.sh picks.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS MOK_PREFETCH
for case in ${TESTS-test_grouped_gemm:60 test_mxfp8_kernels:240 test_fp8_dispatch:60 \
    test_megakernel:90 test_backward_megakernel:120 test_fp8_blockwise_layer:90 test_symm_moe:60 \
    test_emulated_ep:150}; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py \
    > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
  [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_$f.txt | head -12
done
(cd $OUT && tar czf results.tgz pytest_*.txt && rm -f pytest_*.txt)
