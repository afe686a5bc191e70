#!/bin/bash
# Session 28, call 2 (one H200 or H100), branch fp8-ring-depth: what the FP8 engine's ring and
# tile order touch besides the GEMM - both megakernels under the blockwise recipe (the shared
# FP8 k-loop, the forward megakernel's tile groups), BF16's forward megakernel (its tile groups)
# - then the layer under bf16 and fp8_blockwise at 4096 tokens, the EP64-equivalents
# (DeepSeek-V3, MoK's bench model) and, where memory allows, DeepSeek's full experts.
# $OUT/call2.tar.gz, rewritten after every step.
#   bash benchmarks/results/h200_session28/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; mkdir -p $R
save() { tar czf $OUT/call2.tar.gz -C /tmp call2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -s -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt) [rc $?]"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run blockwise_layer 150 tests/gpu/test_fp8_blockwise_layer.py
run bf16_forward_mk 60 tests/gpu/test_megakernel.py
for case in "ep64 300 deepseek_v3_like mok_bench" "full 150 deepseek_v3_like"; do
  set -- $case
  variant=$1 limit=$2; shift 2
  timeout $limit torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
    --fp8-blockwise-megakernel --models "$@" --variants $variant \
    --tokens 4096 --iters 5 --warmup 2 --out $R/bench_$variant > $R/bench_$variant.txt 2>&1
  echo "bench $variant rc $?"
  grep -A9 -E "^(deepseek|mok_bench)" $R/bench_$variant.txt | grep -v "kept from" | cut -c1-230
  save
done
