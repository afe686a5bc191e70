#!/bin/bash
# Session 30, call 3 (one GPU): main's tree as committed (a7cab5d's FP8 consumer, the blockwise
# rounding along rows on the both-forms pass's units): the segment rounding's, FP8 kernels' and
# blockwise layer's tests; where the host's time goes in the Qwen layer's forward under bf16
# and fp8_blockwise (profile_host); the Qwen layer at its EP64-equivalent T=4096.
# $OUT/call3.tar.gz after every step.
#   bash benchmarks/results/h200_session30/call3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call3.tar.gz -C /tmp call3; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -s -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt)"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run kernels 150 tests/gpu/test_fp8_blockwise_kernels.py tests/gpu/test_mxfp8_kernels.py
run blockwise_layer 120 tests/gpu/test_fp8_blockwise_layer.py
for p in bf16 fp8_blockwise; do
  timeout 60 python3 benchmarks/diagnostics/profile_host.py --model qwen3_30b_a3b_like \
    --experts 8 --tokens 4096 --precision $p --forward-kernels separate --calls 100 --top 25 \
    > $R/host_qwen_ep64_$p.txt 2>&1
  echo "profile_host $p rc $?"; grep -E "host issue|function calls" $R/host_qwen_ep64_$p.txt
  save
done
timeout 100 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --models qwen3_30b_a3b_like \
  --variants ep64 --tokens 4096 --iters 5 --warmup 2 --out $R/bench_ep64 > $R/bench_ep64.txt 2>&1
echo "bench ep64 rc $?"
grep -A3 -E "^(deepseek|mok|qwen)" $R/bench_ep64.txt | grep -v "kept from\|peak memory" | cut -c1-230
save
