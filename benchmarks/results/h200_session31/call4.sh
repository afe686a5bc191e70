#!/bin/bash
# Session 31, call 4 (one GPU): call 3's timeline found the first launch of each synchronized
# call holding the host 442-556 us under the blockwise recipe (59-107 us under bf16): the
# first-launch probe (benchmarks/probes/first_launch_probe.py: the next launch's host time
# after each kernel, as is, after preconditioning, with the stack limit raised, with
# LMEM_RESIZE_TO_MAX); then without the profiler, the host time per op of synchronized and
# streamed DeepSeek ep64 forwards (profile_host: which op's launch waits). Written in session
# 31, not run there (no device). $OUT/call4.tar.gz.
#   bash benchmarks/results/h200_session31/call4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call4; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call4.tar.gz -C /tmp call4; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,driver_version --format=csv > $R/gpu.txt
cat $R/gpu.txt
timeout 150 python3 benchmarks/probes/first_launch_probe.py > $R/first_launch.txt 2>&1
echo "probe rc $?"; cat $R/first_launch.txt | cut -c1-160
save
for p in "bf16 separate" "fp8_blockwise megakernel"; do
  set -- $p
  timeout 90 python3 benchmarks/diagnostics/profile_host.py --model deepseek_v3_like \
    --experts 8 --tokens 4096 --precision $1 --forward-kernels $2 --calls 50 --top 8 \
    > $R/host_deepseek_ep64_$1_$2.txt 2>&1
  echo "profile_host $1 $2 rc $?"; grep -E -A5 "host issue|per op and call" $R/host_deepseek_ep64_$1_$2.txt | head -24
  save
done
