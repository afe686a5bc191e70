#!/bin/bash
# Session 22, call 1 (one H200): the forward megakernel under mxfp8 (x rounded at its source,
# act rounded by the storer, weights as values or codes). The GPU tests of the files the change
# touches, then the layer on the DeepSeek and Qwen bench shapes: BF16 separate (mok), BF16
# forward megakernel, mxfp8 separate and mxfp8 forward megakernel (auto's weight form), in one
# run. Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_mxfp8_megakernel/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_mxfp8_kernels:200 test_megakernel:60 test_grouped_gemm:60; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
  [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_$f.txt | head -12
done
for m in deepseek_v3_like:${DS_S:-170} qwen3_30b_a3b_like:${QW_S:-130}; do
  timeout ${m#*:} torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --mxfp8-megakernel \
    --models ${m%:*} --tokens 2048 4096 --iters 5 --warmup 2 \
    --out $OUT/bench_${m%%_*} > $OUT/bench_${m%%_*}.txt 2>&1
  grep -A6 "^${m%%_*}" $OUT/bench_${m%%_*}.txt | grep -v "peak memory\|kept from\|dispatch bytes" | cut -c1-230
done
(cd $OUT && tar czf results.tgz pytest_*.txt bench_* && rm -rf pytest_*.txt bench_deepseek bench_qwen3 bench_*.txt)
