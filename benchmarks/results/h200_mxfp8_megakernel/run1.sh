#!/bin/bash
# Session 22 (one H200): the forward megakernel under mxfp8 (x rounded at its source, act
# rounded by the storer, weights as values or codes) and the weight-code conversion through
# bf16 bits. The GPU tests of the files the changes touch, then the layer on the bench shapes
# of $MODELS (model:timeout_s ...): BF16 separate (mok), the BF16 forward megakernel, mxfp8
# separate and on the forward megakernel, each with the weight forms in $FORMS, in one run.
# Output: $OUT. Run from the repository root with the extension built, e.g.
#   MODELS="deepseek_v3_like:280" FORMS="codes rounded" bash benchmarks/results/h200_mxfp8_megakernel/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in ${TESTS-test_mxfp8_kernels:200 test_megakernel:60 test_grouped_gemm:60}; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
  [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_$f.txt | head -12
done
for m in ${MODELS-deepseek_v3_like:280 qwen3_30b_a3b_like:150}; do
  timeout ${m#*:} torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --mxfp8-megakernel \
    --mxfp8-weights ${FORMS:-auto} --models ${m%:*} --tokens 2048 4096 --iters 5 --warmup 2 \
    --out $OUT/bench_${m%%_*} > $OUT/bench_${m%%_*}.txt 2>&1
  grep -A8 "^${m%%_*}" $OUT/bench_${m%%_*}.txt | grep -v "peak memory\|kept from\|dispatch bytes" | cut -c1-230
done
(cd $OUT && tar czf results.tgz pytest_*.txt bench_* && rm -rf pytest_*.txt bench_deepseek bench_qwen3 bench_*.txt)
