#!/bin/bash
# Session 31, call 5 (written, not run: no device was lent after call 3). The layer at the
# EP64-equivalents T=4096 with bench_moe's synchronized per-call times and --streamed (calls
# back to back, the host ahead as in training), the blockwise recipe on the separate kernels and
# the forward megakernel next to bf16. Needs megatron-core's wheel in .whl (carry it) for the
# alltoall baseline. $OUT/call5.tar.gz after every step.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/results/h200_session31/call5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call5; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call5.tar.gz -C /tmp call5; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
timeout 400 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --streamed --models deepseek_v3_like mok_bench qwen3_30b_a3b_like \
  --variants ep64 --tokens 4096 --iters 5 --warmup 2 --out $R/bench_ep64 > $R/bench_ep64.txt 2>&1
echo "bench rc $?"
grep -A4 -E "^(deepseek|mok|qwen)" $R/bench_ep64.txt | grep -v "kept from\|peak memory" | cut -c1-260
save
