#!/bin/bash
# Session 21, call 6 (one H200): FC1's act rounded to MXFP8 in the GEMM's epilogue (mx_out),
# so MXFP8's FC2 reads it as it is. The tests of the changed engine and epilogue (the
# megakernels share the epilogue header), the forward's per-kernel profile and the DeepSeek
# layer under mxfp8 next to BF16. Output: $OUT. Run from the repository root with the
# extension built:   bash benchmarks/results/h200_round_both/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_mxfp8_kernels:100 test_grouped_gemm:40 test_megakernel:70 test_backward_megakernel:100; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
  [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)|Error|assert" $OUT/pytest_$f.txt | head -12
done
timeout 60 python3 benchmarks/probes/profile_forward.py --model deepseek_v3_like --variant ep64 \
  --tokens 4096 --out $OUT/profile_forward_ds_e8.json > $OUT/profile_forward.txt 2>&1
grep -v "^W1\|warn" $OUT/profile_forward.txt | grep -A12 "mxfp8_rounded" | head -13
timeout 100 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --models deepseek_v3_like \
  --tokens 2048 4096 --iters 5 --warmup 2 --out $OUT/bench_deepseek > $OUT/bench_deepseek.txt 2>&1
grep -A2 "^deepseek" $OUT/bench_deepseek.txt | cut -c1-200
(cd $OUT && tar czf results.tgz pytest_*.txt profile_forward.txt bench_deepseek* \
  && rm -rf pytest_*.txt profile_forward.txt bench_deepseek bench_deepseek.txt)
