#!/bin/bash
# Branch mx-backward-megakernel (one H200): the backward megakernel under mxfp8
# (csrc/megakernel/moe_backward.cu kMx: rounding tiles, the dgrads on the transposed rounded
# weights). The GPU suites that cover it - the new backward-megakernel tests of
# test_mxfp8_kernels (against the MXFP8 reference and the separate backward, settings, graph
# replay, emulated EP=2/4) and the both-forms pass (its arithmetic moved into
# quant/mx_round_span.cuh); the BF16 backward megakernel (its producer's waits are one table
# now) - then the layer on both megakernels, mxfp8 next to BF16, at DeepSeek E=8 T=4096 and
# E=256 T=2048. Output: $OUT. Two calls if the suites take long:
#   TESTS="test_mxfp8_kernels:360" BENCH=0 bash benchmarks/results/h200_mxfp8_backward_megakernel/run1.sh
#   TESTS="test_backward_megakernel:400" bash benchmarks/results/h200_mxfp8_backward_megakernel/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in ${TESTS-test_mxfp8_kernels:360 test_backward_megakernel:400}; do
  f=${case%:*}
  select=()
  [ "$f" = test_mxfp8_kernels ] && select=(-k "backward_megakernel or round_both")
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider "${select[@]}" tests/gpu/$f.py \
    > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
  [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_$f.txt | head -12
done
if [ "${BENCH-1}" = 1 ]; then
  for shape in "ep64 4096" "full 2048"; do
    set -- $shape
    timeout ${BENCH_TIMEOUT:-200} torchrun --nproc-per-node 1 scripts/bench_moe.py --megakernel \
      --mxfp8-megakernels --backward-inputs recomputed --models deepseek_v3_like \
      --variants $1 --tokens $2 --iters 5 --warmup 2 --out $OUT/bench_$1_$2 \
      > $OUT/bench_$1_$2.txt 2>&1
    grep -A9 "^deepseek" $OUT/bench_$1_$2.txt | grep -v "kept from" | cut -c1-230
  done
fi
(cd $OUT && tar czf results.tgz pytest_*.txt bench_* 2>/dev/null && rm -rf pytest_*.txt bench_*)
