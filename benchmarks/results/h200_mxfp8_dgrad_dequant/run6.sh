#!/bin/bash
# Session 20, call 6 (one H200): the dequantizing FP8 pull with kRowVecsInFlight loads in
# flight (csrc/comm/rows.cu). Its bit-exactness test and the MXFP8 layer tests, the forward's
# per-kernel profile (the pull's time against the bf16 pull's), then the layer with both
# weight forms next to BF16 on every bench shape.
# Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_mxfp8_dgrad_dequant/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_fp8_dispatch:40 test_mxfp8_kernels:150; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
done
timeout 100 python3 benchmarks/probes/profile_forward.py --model deepseek_v3_like --variant ep64 \
  --tokens 4096 --out $OUT/profile_forward_ds_e8.json 2>&1 | grep -v "^W1\|warn" | grep -A4 "forward"
for m in deepseek_v3_like:170 qwen3_30b_a3b_like:100; do
  timeout ${m#*:} torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --mxfp8-weights codes rounded \
    --models ${m%:*} --tokens 2048 4096 --iters 5 --warmup 2 \
    --out $OUT/bench_${m%%_*} > $OUT/bench_${m%%_*}.txt 2>&1
  grep -A2 "^${m%%_*}" $OUT/bench_${m%%_*}.txt | cut -c1-220
done
(cd $OUT && tar czf results.tgz pytest_*.txt bench_deepseek bench_qwen3 \
  && rm -rf pytest_*.txt bench_deepseek bench_qwen3)
