#!/bin/bash
# Branch fp8-saved-rows (one H200): with saved backward inputs the FP8 recipes keep forward's
# rows as codes along the expert's rows (csrc/quant/segment_codes.cu). The tests (codes back
# to mx_round_segments' bits; what the autograd node keeps; saved against recomputed bit for
# bit, both recipes), then the layer with saved inputs at DeepSeek E=8 T=4096: the bytes kept
# from forward for backward and the time, mxfp8 and fp8_blockwise next to bf16. Output: $OUT.
#   bash benchmarks/results/h200_fp8_saved_rows/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mxfp8_kernels.py \
  -k "segment_codes or saved_rows or recomputed_equals_saved" > $OUT/pytest_mxfp8.txt 2>&1
echo "test_mxfp8_kernels (saved rows): $(tail -n 1 $OUT/pytest_mxfp8.txt)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_blockwise_layer.py \
  > $OUT/pytest_blockwise.txt 2>&1
echo "test_fp8_blockwise_layer: $(tail -n 1 $OUT/pytest_blockwise.txt)"
timeout 200 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --fp8-blockwise \
  --backward-inputs saved --models deepseek_v3_like --variants ep64 --tokens 4096 --iters 5 \
  --warmup 2 --out $OUT/bench_saved > $OUT/bench_saved.txt 2>&1
grep -A9 "^deepseek" $OUT/bench_saved.txt | cut -c1-230
(cd $OUT && tar czf results.tgz pytest_*.txt bench_* && rm -rf pytest_*.txt bench_*)
