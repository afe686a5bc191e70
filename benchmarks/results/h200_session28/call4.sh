#!/bin/bash
# Session 28, call 4 (one H200), branch fp8-pairs-m: the regressions of the ring/order/pair
# change (the blockwise layer's tests, both FP8 megakernels included; BF16's forward
# megakernel, whose tile groups moved), then the layer under bf16 and fp8_blockwise (separate,
# forward megakernel) at 4096 tokens, the EP64-equivalents (DeepSeek-V3, MoK's bench
# model). $OUT/call4.tar.gz, rewritten after every step.
#   bash benchmarks/results/h200_session28/call4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call4; mkdir -p $R
save() { tar czf $OUT/call4.tar.gz -C /tmp call4; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -s -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt) [rc $?]"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run blockwise_layer 150 tests/gpu/test_fp8_blockwise_layer.py
run bf16_forward_mk 60 tests/gpu/test_megakernel.py
timeout 250 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --models deepseek_v3_like mok_bench --variants ep64 \
  --tokens 4096 --iters 5 --warmup 2 --out $R/bench_ep64 > $R/bench_ep64.txt 2>&1
echo "bench ep64 rc $?"
grep -A6 -E "^(deepseek|mok_bench)" $R/bench_ep64.txt | grep -v "kept from" | cut -c1-230
save
