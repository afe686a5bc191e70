#!/bin/bash
# The fifth call on one H200 (session 18): the MXFP8 dequantizing engine with shared-space
# loads and stores and per-thread offsets (call4's ncu: 43% of its stall cycles on
# local-memory loads, its stage buffers reached by generic 64-bit loads and stores), checked
# (the MXFP8 kernel suite, the grouped GEMM suite) and timed (bench_gemm --mxfp8); then the
# GPU test files call4's suite budget left unrun.
# Output: $OUT. Run from the repository root:
#   bash benchmarks/results/h200_fp8_dispatch/run_dequant.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_mxfp8_kernels:60 test_grouped_gemm:30; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -1 $OUT/pytest_$f.txt) [rc $rc]"
done
timeout 80 python3 scripts/bench_gemm.py --mxfp8 --models deepseek_v3_like qwen3_30b_a3b_like \
  --ep 1 --variants full ep64 --tokens 4096 --iters 10 --out $OUT/gemm_mxfp8.json > $OUT/gemm_mxfp8.txt 2>&1
grep -v "^W1\|warn" $OUT/gemm_mxfp8.txt | cut -c1-230 | tail -12
for case in test_failures:100 test_megatron_moe_layer_vs_reference:70 test_megatron_graph_replay:60 \
    test_megatron_fp8_training:90; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -1 $OUT/pytest_$f.txt) [rc $rc]"
done
(cd $OUT && tar cf pytest_logs.tar pytest_*.txt && rm pytest_*.txt)
