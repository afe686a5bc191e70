#!/bin/bash
# Branch mxfp8-fc1-dequant on one H200 (written in session 18, not yet run): MXFP8's forward
# FC1 on the dequantizing engine with the wire pulled as bf16 values, and the dgrads timed on
# both MXFP8 engines. Checks first (a trapped kernel ends the CUDA context: one pytest per
# file, whole logs), then bench_gemm --mxfp8 (dgrads included) and the layer next to BF16.
# Output: $OUT. Run from the repository root with the branch's extension built:
#   bash benchmarks/results/h200_mxfp8_fc1_dequant/run.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_fp8_dispatch:40 test_mxfp8_kernels:60 test_symm_moe:60 test_grouped_gemm:30; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -1 $OUT/pytest_$f.txt) [rc $rc]"
done
timeout 100 python3 scripts/bench_gemm.py --mxfp8 --models deepseek_v3_like qwen3_30b_a3b_like \
  --ep 1 --variants full ep64 --tokens 4096 --iters 10 --out $OUT/gemm_mxfp8.json > $OUT/gemm_mxfp8.txt 2>&1
grep -v "^W1\|warn" $OUT/gemm_mxfp8.txt | cut -c1-230 | tail -16
timeout 140 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 \
  --models deepseek_v3_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_deepseek > $OUT/bench_deepseek.txt 2>&1
grep -A1 "^deepseek" $OUT/bench_deepseek.txt | cut -c1-200
timeout 80 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 \
  --models qwen3_30b_a3b_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_qwen > $OUT/bench_qwen.txt 2>&1
grep -A1 "^qwen" $OUT/bench_qwen.txt | cut -c1-200
(cd $OUT && tar cf results.tar pytest_*.txt bench_deepseek bench_qwen && rm -rf pytest_*.txt bench_deepseek bench_qwen)
