#!/bin/bash
# Session 22, call 5 (one H200): why the mxfp8 separate path on codes ran 7.29 ms at DeepSeek
# E=256 T=2048 in call 3 (session 21: 6.19). The engine's GEMMs with the F2FP conversion back
# (bench_gemm --mxfp8, against call 2's bit conversion), the separate forward per kernel
# (profile_forward.py: bf16, codes, rounded), and the layer bench with session 21's set of
# paths (--mxfp8 only) for a second sample. Output: $OUT.
#   bash benchmarks/results/h200_mxfp8_megakernel/run5.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
timeout 100 python3 scripts/bench_gemm.py --mxfp8 --models deepseek_v3_like --variants full \
  --ep 1 --tokens 2048 4096 --iters 10 --out $OUT/gemm_deepseek.json > $OUT/gemm_deepseek.txt 2>&1
grep -v "^W1\|warn" $OUT/gemm_deepseek.txt | tail -8 | cut -c1-200
timeout 100 python3 benchmarks/probes/profile_forward.py --model deepseek_v3_like --variant full \
  --tokens 2048 --out $OUT/profile_forward.json > $OUT/profile_forward.txt 2>&1
grep -v "^W1\|warn" $OUT/profile_forward.txt | tail -30 | cut -c1-160
timeout 120 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 --models deepseek_v3_like \
  --variants full --tokens 2048 4096 --iters 5 --warmup 2 --out $OUT/bench_deepseek > $OUT/bench_deepseek.txt 2>&1
grep -A2 "^deepseek" $OUT/bench_deepseek.txt | cut -c1-200
(cd $OUT && tar czf results.tgz gemm_* profile_* bench_* && rm -rf gemm_* profile_* bench_*)
