#!/bin/bash
# Branch fp8-wire-megakernel (one H200): the forward megakernel under mxfp8 pulls FP8 wire
# rows and dequantizes them (megakernel/row_pull.cuh pull_wire_rows_bulk). The GPU suites
# that cover it - the megakernel under mxfp8 against the MXFP8 reference and bit for bit the
# separate path (which pulls the same wire rows), emulated EP=2/4, graph replay; the FP8
# dispatch tests (the dequantizer moved to comm/wire_row.cuh); the BF16 megakernel (its pull
# refactored) - then the layer at DeepSeek E=256 / E=8 for the dispatch bytes per row and the
# time next to BF16. Output: $OUT.
#   bash benchmarks/results/h200_wire_megakernel/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in ${TESTS-test_mxfp8_kernels:220 test_fp8_dispatch:60 test_megakernel:80}; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
  [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_$f.txt | head -12
done
timeout ${BENCH_TIMEOUT:-150} torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8-megakernel \
  --models deepseek_v3_like --tokens 2048 4096 --iters 5 --warmup 2 --out $OUT/bench_deepseek \
  > $OUT/bench_deepseek.txt 2>&1
grep -A8 "^deepseek" $OUT/bench_deepseek.txt | grep -v "peak memory\|kept from" | cut -c1-230
(cd $OUT && tar czf results.tgz pytest_*.txt bench_* && rm -rf pytest_*.txt bench_*)
