#!/bin/bash
# Session 31, call 3 (one GPU): call 2 found the DeepSeek ep64 forward's host issue ~3x the
# Qwen one's on one card (727 against 251 us), and bench_moe missing megatron-core. Here: the
# timeline again with the allocator's cudaMalloc / cudaFree per call and the longest runtime
# calls; the host time per op of the DeepSeek forward (profile_host); bench_moe (DeepSeek, MoK
# ep64, T=4096) on this tree's build and the build before the consumer change (.old_so).
# $OUT/call3.tar.gz after every step.
#   bash benchmarks/results/h200_session31/call3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call3.tar.gz -C /tmp call3; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
NEW=$PWD OLD=/tmp/oldrepo
rm -rf $OLD; mkdir -p $OLD
cp -r mok_megatron scripts configs benchmarks $OLD/; cp .old_so/_C.cpython-312-x86_64-linux-gnu.so $OLD/mok_megatron/
timeout 120 python3 benchmarks/diagnostics/timeline.py --model deepseek_v3_like --variant ep64 \
  --settings "bf16 separate" "fp8_blockwise megakernel" --precondition \
  --out $R/timeline_deepseek.json > $R/timeline_deepseek.txt 2>&1
echo "timeline rc $?"; grep -E "wall|longest" $R/timeline_deepseek.txt | cut -c1-300
save
timeout 90 python3 benchmarks/diagnostics/profile_host.py --model deepseek_v3_like --experts 8 \
  --tokens 4096 --precision fp8_blockwise --forward-kernels megakernel separate --calls 50 \
  --top 12 > $R/host_deepseek_ep64_fp8_blockwise.txt 2>&1
echo "profile_host rc $?"; grep -E -A6 "host issue|outside the ops" $R/host_deepseek_ep64_fp8_blockwise.txt | head -30
save
bench() {  # build (old|new), name, limit, bench_moe arguments...
  local v=$1 name=$2 limit=$3; shift 3
  local R0=$([ $v = old ] && echo $OLD || echo $NEW)
  (cd $R0 && PYTHONPATH=/tmp/site:$R0 timeout $limit torchrun --nproc-per-node 1 \
    scripts/bench_moe.py --fp8-blockwise --fp8-blockwise-megakernel "$@" --tokens 4096 \
    --iters 5 --warmup 2 --out $R/bench_${name}_$v > $R/bench_${name}_$v.txt 2>&1)
  echo "bench $name $v rc $?"
  grep -A3 -E "^(deepseek|mok|qwen)" $R/bench_${name}_$v.txt | grep -v "kept from" | cut -c1-230
  tail -3 $R/bench_${name}_$v.txt | cut -c1-200
  save
}
bench new ep64 200 --models deepseek_v3_like mok_bench --variants ep64
bench old ep64 200 --models deepseek_v3_like mok_bench --variants ep64
