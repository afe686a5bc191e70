#!/bin/bash
# Session 32, call 1 (one GPU; the device budget left after failed starts allows one call, so
# the planned two are one, most needed first). (1) The CUDA-graph weight cache (06796c2,
# applied from docs/experiments/fp8-graph-weight-cache.patch): the blockwise layer's and
# kernels' GPU tests and MXFP8's (the shared cache changed). (2) Session 31's first-launch
# probe (the next launch's host time after each kernel, as is, preconditioned, stack limit
# raised, LMEM_RESIZE_TO_MAX). (3) bench_moe at the DeepSeek and Qwen EP64-equivalents, T=4096,
# synchronized, --streamed (calls back to back, the host ahead as in training) and
# --cuda-graph (replays quantize the weights only after weights_changed()). (4) profile_host's
# per-op host time, DeepSeek ep64 blockwise megakernel. Needs megatron-core's wheel in .whl
# (carried) for the alltoall baseline. $OUT/call1.tar.gz after every step.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/results/h200_session32/call1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call1.tar.gz -C /tmp call1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,driver_version --format=csv > $R/gpu.txt
cat $R/gpu.txt
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -s -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt)"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run blockwise 150 tests/gpu/test_fp8_blockwise_layer.py tests/gpu/test_fp8_blockwise_kernels.py
run mxfp8_kernels 90 tests/gpu/test_mxfp8_kernels.py
timeout 80 python3 benchmarks/probes/first_launch_probe.py > $R/first_launch.txt 2>&1
echo "probe rc $?"; cut -c1-160 $R/first_launch.txt
save
timeout 220 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --streamed --cuda-graph --models deepseek_v3_like \
  qwen3_30b_a3b_like --variants ep64 --tokens 4096 --iters 5 --warmup 2 \
  --out $R/bench_ep64 > $R/bench_ep64.txt 2>&1
echo "bench rc $?"
grep -A7 -E "^(deepseek|mok|qwen)" $R/bench_ep64.txt | grep -v "kept from\|peak memory" | cut -c1-260
save
timeout 60 python3 benchmarks/diagnostics/profile_host.py --model deepseek_v3_like \
  --experts 8 --tokens 4096 --precision fp8_blockwise --forward-kernels megakernel --calls 50 \
  --top 8 > $R/host_deepseek_ep64.txt 2>&1
echo "profile_host rc $?"; grep -E -A5 "host issue|per op and call" $R/host_deepseek_ep64.txt | head -24
save
