#!/bin/bash
# Session 32, call 2 (one GPU): the layer at the EP64-equivalents, T=4096, blockwise on the
# separate kernels and the forward megakernel next to bf16 and alltoall, with bench_moe's
# synchronized per-call times and --streamed (calls back to back, the host ahead as in
# training; session 31's call 5); then --cuda-graph at Qwen and DeepSeek ep64 with the graph
# weight cache (06796c2: replays quantize the weights only after weights_changed()).
# Needs megatron-core's wheel in .whl (carried). $OUT/call2.tar.gz after every step.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/results/h200_session32/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call2.tar.gz -C /tmp call2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
bench() {  # name, limit, bench_moe arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
    --fp8-blockwise-megakernel "$@" --tokens 4096 --iters 5 --warmup 2 --out $R/bench_$name \
    > $R/bench_$name.txt 2>&1
  echo "bench $name rc $?"
  grep -A5 -E "^(deepseek|mok|qwen)" $R/bench_$name.txt | grep -v "kept from\|peak memory" | cut -c1-260
  save
}
bench ep64 330 --models deepseek_v3_like mok_bench qwen3_30b_a3b_like --variants ep64 --streamed
bench graph 200 --models qwen3_30b_a3b_like deepseek_v3_like --variants ep64 --cuda-graph
