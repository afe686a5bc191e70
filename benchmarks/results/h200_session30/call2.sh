#!/bin/bash
# Session 30, call 2 (one GPU): call 1's consumer plus the blockwise rounding along rows on the
# both-forms pass's units (mx_round_segments with 128-row blocks: act for FC2's wgrad) against
# main's a7cab5d build (.old_so): the segment rounding's and FP8 kernels' tests, bench_gemm at
# DeepSeek E=8 T=4096 new / old (the engine A/B call 1 lacked), the Qwen layer's kernels per
# recipe, the blockwise layer's tests, the layer at the EP64-equivalents T=4096 (and Qwen's
# under CUDA graphs: GPU time without the host's). $OUT/call2.tar.gz after every step.
#   bash benchmarks/results/h200_session30/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call2.tar.gz -C /tmp call2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
NEW=$PWD OLD=/tmp/oldrepo
rm -rf $OLD; mkdir -p $OLD
cp -r mok_megatron scripts configs $OLD/; cp .old_so/_C.cpython-312-x86_64-linux-gnu.so $OLD/mok_megatron/
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -s -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt)"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run kernels 150 tests/gpu/test_fp8_blockwise_kernels.py tests/gpu/test_mxfp8_kernels.py
gemm() {  # build (old|new), name, bench_gemm model arguments...
  local v=$1 name=$2; shift 2
  local R0=$([ $v = old ] && echo $OLD || echo $NEW)
  (cd $R0/scripts && PYTHONPATH=/tmp/site:$R0 timeout 90 python3 bench_gemm.py --fp8-blockwise \
    "$@" --tokens 4096 --out $R/gemm_${name}_$v.json > $R/gemm_${name}_$v.txt 2>&1)
  echo "bench_gemm $name $v rc $?"
  grep -E "FP8 blockwise|same blockwise" $R/gemm_${name}_$v.txt | cut -c1-250 | head -4
  save
}
gemm new deepseek_e8 --models deepseek_v3_like --variants full --ep 32
gemm old deepseek_e8 --models deepseek_v3_like --variants full --ep 32
timeout 90 python3 benchmarks/diagnostics/profile_recipes.py --model qwen3_30b_a3b_like \
  --variant ep64 --settings "bf16 separate" "fp8_blockwise separate" --top 12 \
  --out $R/profile_qwen_ep64.json > $R/profile_qwen_ep64.txt 2>&1
echo "profile qwen ep64 rc $?"; grep -E "us, kernels|round|quantize" $R/profile_qwen_ep64.txt | cut -c1-140
save
run blockwise_layer 150 tests/gpu/test_fp8_blockwise_layer.py
bench() {  # name, limit, bench_moe arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
    --fp8-blockwise-megakernel "$@" --tokens 4096 --iters 5 --warmup 2 --out $R/bench_$name \
    > $R/bench_$name.txt 2>&1
  echo "bench $name rc $?"
  grep -A3 -E "^(deepseek|mok|qwen)" $R/bench_$name.txt | grep -v "kept from" | cut -c1-230
  save
}
bench ep64 200 --models deepseek_v3_like mok_bench qwen3_30b_a3b_like --variants ep64
bench qwen_graph 120 --models qwen3_30b_a3b_like --variants ep64 --cuda-graph
