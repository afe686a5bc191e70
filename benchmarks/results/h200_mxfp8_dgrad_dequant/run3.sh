#!/bin/bash
# Session 20, call 3 (one H200): MXFP8 weights in two forms (kernel.mxfp8_weights): codes
# (dequantized per GEMM tile in shared memory) and rounded (their bf16 values, now on our tile
# engine instead of torch._grouped_mm). Checks first (one pytest per file; Megatron's
# training loop under mxfp8), then the layer with both forms forced, side by side with BF16,
# on every bench shape (auto's threshold is set from these).
# Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_mxfp8_dgrad_dequant/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_mxfp8_kernels:150; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
done
timeout 150 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_megatron_fp8_training.py \
  -k mxfp8 > $OUT/pytest_megatron_fp8_training_mxfp8.txt 2>&1
echo "megatron mxfp8: $(grep -h 'max relative loss difference:' $OUT/pytest_megatron_fp8_training_mxfp8.txt) $(tail -n 1 $OUT/pytest_megatron_fp8_training_mxfp8.txt)"
timeout 170 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --mxfp8-weights codes rounded \
  --models deepseek_v3_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_deepseek > $OUT/bench_deepseek.txt 2>&1
grep -A2 "^deepseek" $OUT/bench_deepseek.txt | cut -c1-220
timeout 100 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --mxfp8-weights codes rounded \
  --models qwen3_30b_a3b_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_qwen > $OUT/bench_qwen.txt 2>&1
grep -A2 "^qwen" $OUT/bench_qwen.txt | cut -c1-220
grep "peak memory" $OUT/bench_*.txt | cut -c1-260
(cd $OUT && tar czf results.tgz pytest_*.txt bench_deepseek bench_qwen \
  && rm -rf pytest_*.txt bench_deepseek bench_qwen)
