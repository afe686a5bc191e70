#!/bin/bash
# Session 30, call 1b (one GPU): the rest of call 1 (whose outputs step passed - 16 of 16
# bit-identical - and whose archive of the ~1 GB outputs then used up the call): the FP8
# kernels' tests, bench_gemm's engine figures new / old at DeepSeek E=8 and new at MoK ep64
# T=4096, the Qwen layer's kernels per recipe (profile_recipes), the blockwise layer's tests.
# $OUT/call1b.tar.gz after every step.
#   bash benchmarks/results/h200_session30/call1b.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call1b; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call1b.tar.gz -C /tmp call1b; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
NEW=$PWD OLD=/tmp/oldrepo
rm -rf $OLD; mkdir -p $OLD/benchmarks
cp -r mok_megatron scripts $OLD/; cp .old_so/_C.cpython-312-x86_64-linux-gnu.so $OLD/mok_megatron/
timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_fp8_blockwise_kernels.py > $R/pytest_fp8_kernels.txt 2>&1
echo "fp8_kernels: $(tail -n 1 $R/pytest_fp8_kernels.txt)"
grep -E "^(FAILED|ERROR)" $R/pytest_fp8_kernels.txt | head -8 | cut -c1-220
save
gemm() {  # build (old|new), name, bench_gemm model arguments...
  local v=$1 name=$2; shift 2
  local R0=$([ $v = old ] && echo $OLD || echo $NEW)
  (cd $R0/scripts && PYTHONPATH=/tmp/site:$R0 timeout 90 python3 bench_gemm.py --fp8-blockwise \
    "$@" --tokens 4096 --out $R/gemm_${name}_$v.json > $R/gemm_${name}_$v.txt 2>&1)
  echo "bench_gemm $name $v rc $?"
  grep -E "FP8 blockwise|same blockwise|ring depth" $R/gemm_${name}_$v.txt | cut -c1-250 | head -6
  save
}
gemm new deepseek_e8 --models deepseek_v3_like --variants full --ep 32
gemm old deepseek_e8 --models deepseek_v3_like --variants full --ep 32
gemm new mok_ep64 --models mok_bench --variants ep64
timeout 100 python3 benchmarks/diagnostics/profile_recipes.py --model qwen3_30b_a3b_like \
  --variant ep64 --top 10 --out $R/profile_qwen_ep64.json > $R/profile_qwen_ep64.txt 2>&1
echo "profile qwen ep64 rc $?"; cut -c1-140 $R/profile_qwen_ep64.txt | grep -v Warning | head -90
save
timeout 180 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_fp8_blockwise_layer.py > $R/pytest_blockwise_layer.txt 2>&1
echo "blockwise_layer: $(tail -n 1 $R/pytest_blockwise_layer.txt)"
grep -E "^(FAILED|ERROR)" $R/pytest_blockwise_layer.txt | head -8 | cut -c1-220
save
