#!/bin/bash
# Session 16 device run (1x H200): the FP8 engine under MXFP8 - tests, GEMM and layer benchmarks
# (what each version ran: README.md).
# Output: $OUT (pytest logs, bench text, JSON).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
timeout 90 python3 -m pytest -q -x tests/gpu/test_mxfp8_kernels.py -k "fp8_engine" 2>&1 | tail -15 > $OUT/pytest_engine.txt
cat $OUT/pytest_engine.txt
timeout 100 python3 scripts/bench_gemm.py --mxfp8 --fp8-blockwise --models deepseek_v3_like qwen3_30b_a3b_like \
  --ep 1 --variants full ep64 --tokens 4096 --iters 10 --out $OUT/gemm_mx.json > $OUT/gemm_mx.txt 2>&1
cut -c1-260 $OUT/gemm_mx.txt | tail -12
timeout 150 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --fp8-blockwise \
  --models deepseek_v3_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_deepseek > $OUT/bench_deepseek.txt 2>&1
grep -v "^W1\|warn" $OUT/bench_deepseek.txt | tail -24 | cut -c1-220
timeout 130 python3 -m pytest -q tests/gpu/test_mxfp8_kernels.py tests/gpu/test_fp8_blockwise_kernels.py 2>&1 | tail -25 > $OUT/pytest_mxfp8.txt
tail -8 $OUT/pytest_mxfp8.txt
timeout 90 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --fp8-blockwise \
  --models qwen3_30b_a3b_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_qwen > $OUT/bench_qwen.txt 2>&1
grep -v "^W1\|warn" $OUT/bench_qwen.txt | tail -24 | cut -c1-220
timeout 200 python3 -m pytest -q -s tests/gpu/test_megatron_fp8_training.py -k mxfp8 > $OUT/pytest_megatron_mxfp8_training.txt 2>&1
tail -6 $OUT/pytest_megatron_mxfp8_training.txt
# At most 8 files come back: the JSON and charts travel as one tar.
cd $OUT && tar cf bench_json.tar bench_deepseek bench_qwen gemm_mx.json && rm -rf bench_deepseek bench_qwen gemm_mx.json
