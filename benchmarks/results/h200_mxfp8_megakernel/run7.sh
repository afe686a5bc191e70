#!/bin/bash
# Session 22, call 7 (one H200; call 8 reruns it with bench_moe.py's precondition() before
# every timing): the mxfp8 forward megakernel at DeepSeek E=8 T=4096 ran 4.68 ms in call 3
# and 5.76 in call 6, whose run had no mxfp8 separate path before it. Two runs of
# each path set, alternating: A = --mxfp8-megakernel (call 6's), B = --mxfp8
# --mxfp8-megakernel (call 3's). Output: $OUT.
#   bash benchmarks/results/h200_mxfp8_megakernel/run7.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for run in A1:--mxfp8-megakernel B1:"--mxfp8 --mxfp8-megakernel" A2:--mxfp8-megakernel \
           B2:"--mxfp8 --mxfp8-megakernel"; do
  name=${run%%:*}
  timeout 80 torchrun --nproc-per-node 1 scripts/bench_moe.py ${run#*:} --models deepseek_v3_like \
    --variants ep64 --tokens 4096 --iters 7 --warmup 2 --out $OUT/bench_$name > $OUT/bench_$name.txt 2>&1
  echo "== $name (${run#*:})"; grep -A3 "^deepseek" $OUT/bench_$name.txt | grep "fwd" | cut -c1-200
done
(cd $OUT && tar czf results.tgz bench_* && rm -rf bench_*)
