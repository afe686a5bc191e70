#!/bin/bash
# Session 34, call 3 (one GPU). Call 2's trace put the blockwise FC2 tiles at Qwen ep64 behind
# their storer (4.8 us per tile holding the slots against a 3.1 us mainloop: two dependent
# global loads per row) and found the bulk code pull slower at DeepSeek (1348-1411 us against
# the converting warps' 768-810). This tree: the FC2 storer's row loads together and the ranks'
# bases from the lanes; the pull's slots padded to 128-byte lines. (1) Traces, blockwise at Qwen
# and DeepSeek ep64 T=4096, before (.old_so: fbafef6's build, in a copy of the tree) and after.
# (2) The GPU tests of every changed path, then the files call 1 did not reach, for SUITE_S
# seconds. (3) bench_moe --fp8-blockwise --fp8-blockwise-megakernel --cuda-graph, both shapes.
# $OUT/call3.tar.gz after every step.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/results/h200_session34/call3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call3.tar.gz -C /tmp call3; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
SITE=${PYTHONPATH%%:*}
rm -rf /tmp/before && mkdir /tmp/before && cp -r mok_megatron benchmarks scripts configs /tmp/before/
cp .old_so/_C.cpython-312-x86_64-linux-gnu.so /tmp/before/mok_megatron/
trace() {  # $1: tree, $2: name
  (cd $1 && PYTHONPATH=$SITE:$1 timeout 60 python3 benchmarks/diagnostics/trace_tiles.py \
    --models qwen3_30b_a3b_like deepseek_v3_like --variants ep64 --tokens 4096 \
    --precision fp8_blockwise --out $R/trace_$2.json > $R/trace_$2.txt 2>&1)
  echo "trace $2 rc $?"; cut -c1-420 $R/trace_$2.txt | tail -7
}
trace /tmp/before before; save
trace $PWD after; save
FILES="${FILES:-test_fp8_blockwise_layer test_megakernel test_emulated_ep test_backward_megakernel test_megatron_graph_replay test_megatron_moe_layer_vs_reference test_mxfp8_kernels}"
timeout ${SUITE_S:-200} python3 -m pytest -v -rfE -p no:cacheprovider \
  $(for f in $FILES; do echo tests/gpu/$f.py; done) > $R/pytest_gpu.txt 2>&1
echo "pytest rc $?"; grep -c PASSED $R/pytest_gpu.txt; grep -E "FAILED|ERROR" $R/pytest_gpu.txt | head; tail -2 $R/pytest_gpu.txt
save
timeout ${BENCH_S:-150} torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --cuda-graph --models qwen3_30b_a3b_like deepseek_v3_like \
  --variants ep64 --tokens 4096 --iters 5 --warmup 2 --out $R/bench_ep64 > $R/bench_ep64.txt 2>&1
echo "bench rc $?"; grep -E "^(qwen|deepseek)|^ {20}[a-z]" $R/bench_ep64.txt | cut -c1-260
save
