#!/bin/bash
# Session 21, call 4 (one H200): the both-ways kernels with fewer instructions per value (bf16
# magnitude patterns for the amax, two values per conversion, 32-bit pull addressing). The GPU
# tests of the files the change touches, the backward profiles under both FP8 recipes
# (DeepSeek E=8 T=4096), the layer under both recipes next to BF16 on the DeepSeek and Qwen
# bench shapes. Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_round_both/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_fp8_dispatch:60 test_fp8_blockwise_kernels:60 test_mxfp8_kernels:150 \
            test_fp8_blockwise_layer:100 test_symm_moe:100; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
  [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_$f.txt | head -12
done
for p in mxfp8 fp8_blockwise; do
  timeout 60 python3 scripts/profile_backward.py --model deepseek_v3_like --variant ep64 \
    --tokens 4096 --precision $p --out $OUT/profile_backward_${p}_ds_e8.json > $OUT/profile_backward_$p.txt 2>&1
  grep -v "^W1\|warn" $OUT/profile_backward_$p.txt | grep -A12 "separate" | head -14
done
for m in deepseek_v3_like:200 qwen3_30b_a3b_like:150; do
  timeout ${m#*:} torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --fp8-blockwise \
    --models ${m%:*} --tokens 2048 4096 --iters 5 --warmup 2 \
    --out $OUT/bench_${m%%_*} > $OUT/bench_${m%%_*}.txt 2>&1
  grep -A3 "^${m%%_*}" $OUT/bench_${m%%_*}.txt | cut -c1-200
done
(cd $OUT && tar czf results.tgz pytest_*.txt profile_backward_*.txt bench_* \
  && rm -rf pytest_*.txt profile_backward_*.txt bench_deepseek bench_qwen3 bench_*.txt)
