#!/bin/bash
# The second call on one H200 (session 18): run.sh's first call hung in the new FP8 wgrad (its
# column-scale TMA box was MXFP8's four scale blocks per stage, the ring counted one: the
# box overran the stage's scales into its barriers). After the fix: both recipes' suites, one
# pytest per file with whole logs (a trapped kernel ends the CUDA context, so the first
# failure of a file is the one to read), then the layer next to BF16 and alltoall.
# Output: $OUT. Run from the repository root:
#   bash benchmarks/results/h200_fp8_dispatch/run_layer.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_fp8_blockwise_kernels:60 test_mxfp8_kernels:60 test_fp8_blockwise_layer:80 \
    test_symm_moe:110; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  echo "$f: $(tail -1 $OUT/pytest_$f.txt)"
done
timeout 150 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --fp8-blockwise \
  --models deepseek_v3_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_deepseek > $OUT/bench_deepseek.txt 2>&1
grep -v "^W1\|warn" $OUT/bench_deepseek.txt | tail -24 | cut -c1-220
timeout 100 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --fp8-blockwise \
  --models qwen3_30b_a3b_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_qwen > $OUT/bench_qwen.txt 2>&1
grep -v "^W1\|warn" $OUT/bench_qwen.txt | tail -24 | cut -c1-220
cd $OUT && tar cf bench_json.tar bench_deepseek bench_qwen && rm -rf bench_deepseek bench_qwen
