#!/bin/bash
# Session 33, call 1 (one GPU). (1) Tile traces of the forward megakernel at the Qwen and
# DeepSeek EP64-equivalents, T=4096: BF16 (raw problem, no h) and, new, the blockwise recipe
# (trace_tiles --precision fp8_blockwise: the layer's launch with a trace buffer) - where the
# blockwise megakernel's 0.92 ms at Qwen goes (mainloops against waits). (2) The GPU suite,
# the blockwise recipe's files first, for SUITE_S seconds (-v: every test's outcome as it
# ends; FILES= names other files). (3) profile_recipes at Qwen ep64 (session 32's call 3) if the call's time allows.
# $OUT/call1.tar.gz after every step.
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
  timeout 50 python3 benchmarks/diagnostics/trace_tiles.py --models qwen3_30b_a3b_like \
    deepseek_v3_like --variants ep64 --tokens 4096 --no-h --precision $prec \
    --out $R/trace_$prec.json > $R/trace_$prec.txt 2>&1
  echo "trace $prec rc $?"; cut -c1-300 $R/trace_$prec.txt | tail -8
  save
done
FILES="${FILES:-test_fp8_blockwise_layer test_fp8_blockwise_kernels test_megatron_fp8_training test_fp8_dispatch test_megakernel test_backward_megakernel test_symm_moe test_grouped_gemm test_schedule test_failures test_emulated_ep test_mxfp8_kernels test_megatron_graph_replay test_megatron_moe_layer_vs_reference}"
timeout ${SUITE_S:-380} python3 -m pytest -v -rfE -p no:cacheprovider \
  $(for f in $FILES; do echo tests/gpu/$f.py; done) \
  > $R/pytest_gpu.txt 2>&1
echo "pytest rc $?"; grep -c PASSED $R/pytest_gpu.txt; grep -E "FAILED|ERROR" $R/pytest_gpu.txt | head; tail -2 $R/pytest_gpu.txt
save
timeout 80 python3 benchmarks/diagnostics/profile_recipes.py --model qwen3_30b_a3b_like \
  --variant ep64 --settings "bf16 megakernel" "fp8_blockwise megakernel" \
  "fp8_blockwise separate" "bf16 separate" --iters 3 --top 12 \
  --out $R/profile_qwen_ep64.json > $R/profile_qwen_ep64.txt 2>&1
echo "profile qwen ep64 rc $?"; cut -c1-150 $R/profile_qwen_ep64.txt | grep -v "^ " | head -20
save
