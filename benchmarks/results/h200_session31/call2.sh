#!/bin/bash
# Session 31, call 2 (one GPU): why bench_moe's blockwise forward ratio (session 30: 1.19x at
# DeepSeek ep64) sits below the training forward's in call 1's timeline (1.38x, another card):
# on one card, timeline.py with bench_moe's preconditioning and its no-grad forward, and
# bench_moe itself (DeepSeek, MoK ep64, T=4096) on this tree's build and on the build before
# the consumer change (.old_so) - the consumer change's layer A/B; the host time per op of the
# Qwen ep64 forward (profile_host, bf16 / fp8_blockwise). $OUT/call2.tar.gz after every step.
#   bash benchmarks/results/h200_session31/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call2.tar.gz -C /tmp call2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
NEW=$PWD OLD=/tmp/oldrepo
rm -rf $OLD; mkdir -p $OLD
cp -r mok_megatron scripts configs benchmarks $OLD/; cp .old_so/_C.cpython-312-x86_64-linux-gnu.so $OLD/mok_megatron/
timeout 150 python3 benchmarks/diagnostics/timeline.py --model deepseek_v3_like --variant ep64 \
  --settings "bf16 separate" "fp8_blockwise separate" "fp8_blockwise megakernel" --precondition \
  --out $R/timeline_deepseek.json > $R/timeline_deepseek.txt 2>&1
echo "timeline rc $?"; grep -E "wall" $R/timeline_deepseek.txt | cut -c1-150
save
bench() {  # build (old|new), name, limit, bench_moe arguments...
  local v=$1 name=$2 limit=$3; shift 3
  local R0=$([ $v = old ] && echo $OLD || echo $NEW)
  (cd $R0 && PYTHONPATH=$R0 timeout $limit torchrun --nproc-per-node 1 scripts/bench_moe.py \
    --fp8-blockwise --fp8-blockwise-megakernel "$@" --tokens 4096 --iters 5 --warmup 2 \
    --out $R/bench_${name}_$v > $R/bench_${name}_$v.txt 2>&1)
  echo "bench $name $v rc $?"
  grep -A3 -E "^(deepseek|mok|qwen)" $R/bench_${name}_$v.txt | grep -v "kept from" | cut -c1-230
  save
}
bench new ep64 200 --models deepseek_v3_like mok_bench --variants ep64
bench old ep64 200 --models deepseek_v3_like mok_bench --variants ep64
for p in bf16 fp8_blockwise; do
  timeout 60 python3 benchmarks/diagnostics/profile_host.py --model qwen3_30b_a3b_like \
    --experts 8 --tokens 4096 --precision $p --forward-kernels separate megakernel --calls 100 \
    --top 12 > $R/host_qwen_ep64_$p.txt 2>&1
  echo "profile_host $p rc $?"; grep -E "host issue|outside the ops" $R/host_qwen_ep64_$p.txt
  save
done
