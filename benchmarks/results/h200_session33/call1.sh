#!/bin/bash
# Session 33, call 1 (one GPU). (1) Tile traces of the forward megakernel at the Qwen and
# DeepSeek EP64-equivalents, T=4096: BF16 (raw problem, no h) and, new, the blockwise recipe
# (trace_tiles --precision fp8_blockwise: the layer's launch with a trace buffer) - where the
# blockwise megakernel's 0.92 ms at Qwen goes (mainloops against waits). (2) The traced
# launch's GPU test. (3) Session 32's call 2: profile_recipes at Qwen ep64, bench_gemm Qwen
# ep64, bench_moe MoK ep64 --streamed --cuda-graph. $OUT/call1.tar.gz after every step.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/results/h200_session33/call1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call1.tar.gz -C /tmp call1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
for prec in bf16 fp8_blockwise; do
  timeout 60 python3 benchmarks/diagnostics/trace_tiles.py --models qwen3_30b_a3b_like \
    deepseek_v3_like --variants ep64 --tokens 4096 --no-h --precision $prec \
    --out $R/trace_$prec.json > $R/trace_$prec.txt 2>&1
  echo "trace $prec rc $?"; cut -c1-300 $R/trace_$prec.txt | tail -12
  save
done
timeout 60 python3 -m pytest -q -x tests/gpu/test_fp8_blockwise_layer.py -k "traced or refuses" \
  > $R/pytest_trace.txt 2>&1
echo "pytest rc $?"; tail -3 $R/pytest_trace.txt
save
timeout 90 python3 benchmarks/diagnostics/profile_recipes.py --model qwen3_30b_a3b_like \
  --variant ep64 --top 14 --out $R/profile_qwen_ep64.json > $R/profile_qwen_ep64.txt 2>&1
echo "profile qwen ep64 rc $?"; cut -c1-150 $R/profile_qwen_ep64.txt | head -90
save
(cd scripts && timeout 60 python3 bench_gemm.py --fp8-blockwise --models qwen3_30b_a3b_like \
  --variants ep64 --tokens 4096 --out $R/gemm_qwen_ep64.json > $R/gemm_qwen_ep64.txt 2>&1)
echo "bench_gemm qwen ep64 rc $?"; grep -A4 "^qwen" $R/gemm_qwen_ep64.txt | cut -c1-250
save
timeout 150 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --streamed --cuda-graph --models mok_bench --variants ep64 \
  --tokens 4096 --iters 5 --warmup 2 --out $R/bench_mok_ep64 > $R/bench_mok_ep64.txt 2>&1
echo "bench rc $?"
grep -A7 -E "^(deepseek|mok|qwen)" $R/bench_mok_ep64.txt | grep -v "kept from\|peak memory" | cut -c1-400
grep "graph failed" $R/bench_mok_ep64.txt | cut -c1-200
save
