#!/bin/bash
# Session 32, call 1 (one GPU). (1) The CUDA-graph weight cache (06796c2, applied from
# docs/experiments/fp8-graph-weight-cache.patch): the blockwise layer's and kernels' GPU tests
# and MXFP8's (the shared cache changed). (2) Session 31's call 4, not run there: the
# first-launch probe (the next launch's host time after each kernel, as is, preconditioned,
# stack limit raised, LMEM_RESIZE_TO_MAX) and profile_host's per-op host time, synchronized and
# streamed, DeepSeek ep64. $OUT/call1.tar.gz after every step.
#   PYTHONPATH=$PWD bash benchmarks/results/h200_session32/call1.sh
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
run blockwise_layer 150 tests/gpu/test_fp8_blockwise_layer.py
run blockwise_kernels 120 tests/gpu/test_fp8_blockwise_kernels.py
run mxfp8_kernels 120 tests/gpu/test_mxfp8_kernels.py
timeout 120 python3 benchmarks/probes/first_launch_probe.py > $R/first_launch.txt 2>&1
echo "probe rc $?"; cut -c1-160 $R/first_launch.txt
save
for p in "bf16 separate" "fp8_blockwise megakernel"; do
  set -- $p
  timeout 90 python3 benchmarks/diagnostics/profile_host.py --model deepseek_v3_like \
    --experts 8 --tokens 4096 --precision $1 --forward-kernels $2 --calls 50 --top 8 \
    > $R/host_deepseek_ep64_$1_$2.txt 2>&1
  echo "profile_host $1 $2 rc $?"
  grep -E -A5 "host issue|per op and call" $R/host_deepseek_ep64_$1_$2.txt | head -24
  save
done
