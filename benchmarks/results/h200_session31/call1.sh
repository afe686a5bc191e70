#!/bin/bash
# Session 31, call 1 (one GPU). (1) main's build before the consumer change (.old_so, as
# /tmp/oldrepo): where a synchronized call's wall time goes that its kernels do not cover
# (benchmarks/diagnostics/timeline.py), DeepSeek and Qwen EP64-equivalents at T=4096, bf16
# separate against fp8_blockwise on both forward kernels. (2) The consumer change (this tree's
# build): the FP8 GEMM's outputs bit for bit against the old build's (engine_outputs.py), the
# FP8 kernel tests, bench_gemm new / old at DeepSeek E=8 T=4096, the blockwise layer's tests
# (both megakernels run the consumer). $OUT/call1.tar.gz after every step.
#   bash benchmarks/results/h200_session31/call1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call1.tar.gz -C /tmp call1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
NEW=$PWD OLD=/tmp/oldrepo
rm -rf $OLD; mkdir -p $OLD
cp -r mok_megatron scripts configs benchmarks $OLD/; cp .old_so/_C.cpython-312-x86_64-linux-gnu.so $OLD/mok_megatron/
for m in deepseek_v3_like qwen3_30b_a3b_like; do
  (cd $OLD && PYTHONPATH=$OLD timeout 150 python3 benchmarks/diagnostics/timeline.py --model $m \
    --variant ep64 --settings "bf16 separate" "fp8_blockwise separate" "fp8_blockwise megakernel" \
    --out $R/timeline_${m}.json > $R/timeline_${m}.txt 2>&1)
  echo "timeline $m rc $?"; grep -E "wall" $R/timeline_${m}.txt | cut -c1-200
  save
done
(cd $OLD && PYTHONPATH=$OLD timeout 60 python3 benchmarks/diagnostics/engine_outputs.py save $R/old.pt)
PYTHONPATH=$NEW timeout 60 python3 benchmarks/diagnostics/engine_outputs.py save $R/new.pt
python3 benchmarks/diagnostics/engine_outputs.py compare $R/old.pt $R/new.pt | tee $R/engine_compare.txt
rm -f $R/old.pt $R/new.pt
save
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -s -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt)"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run fp8_kernels 120 tests/gpu/test_fp8_blockwise_kernels.py
gemm() {  # build (old|new), name, bench_gemm model arguments...
  local v=$1 name=$2; shift 2
  local R0=$([ $v = old ] && echo $OLD || echo $NEW)
  (cd $R0/scripts && PYTHONPATH=$R0 timeout 90 python3 bench_gemm.py --fp8-blockwise \
    "$@" --tokens 4096 --out $R/gemm_${name}_$v.json > $R/gemm_${name}_$v.txt 2>&1)
  echo "bench_gemm $name $v rc $?"
  grep -E "FP8 blockwise|same blockwise" $R/gemm_${name}_$v.txt | cut -c1-250 | head -4
  save
}
gemm new deepseek_e8 --models deepseek_v3_like --variants full --ep 32
gemm old deepseek_e8 --models deepseek_v3_like --variants full --ep 32
gemm new deepseek_e8_again --models deepseek_v3_like --variants full --ep 32
run blockwise_layer 150 tests/gpu/test_fp8_blockwise_layer.py
