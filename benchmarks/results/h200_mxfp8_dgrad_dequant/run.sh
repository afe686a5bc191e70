#!/bin/bash
# Session 20, call 1 (one H200): every MXFP8 GEMM on the dequantizing engine (the dgrads moved
# off the FP8 engine, whose MXFP8 variant is removed). Checks first (one pytest per file,
# whole logs), then bench_gemm --mxfp8 (forward and dgrad GEMMs next to torch bf16), the layer
# next to BF16 and Nsight Compute on the dequantizing engine's FC1 at DeepSeek E=8 T=4096
# (source page included; every output tarred: the device returns only a few files).
# Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_mxfp8_dgrad_dequant/run.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
for case in test_mxfp8_kernels:90 test_fp8_blockwise_kernels:60 test_fp8_blockwise_layer:90 \
            test_fp8_dispatch:40; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -n 1 $OUT/pytest_$f.txt) [rc $rc]"
done
timeout 100 python3 scripts/bench_gemm.py --mxfp8 --models deepseek_v3_like qwen3_30b_a3b_like \
  --ep 1 --variants full ep64 --tokens 4096 --iters 10 --out $OUT/gemm_mxfp8.json > $OUT/gemm_mxfp8.txt 2>&1
grep -v "^W1\|warn" $OUT/gemm_mxfp8.txt | cut -c1-230 | tail -12
timeout 140 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 \
  --models deepseek_v3_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_deepseek > $OUT/bench_deepseek.txt 2>&1
grep -A1 "^deepseek" $OUT/bench_deepseek.txt | cut -c1-200
timeout 80 torchrun --nproc-per-node 1 scripts/bench_moe.py --mxfp8 \
  --models qwen3_30b_a3b_like --tokens 2048 4096 --iters 5 --warmup 2 \
  --out $OUT/bench_qwen > $OUT/bench_qwen.txt 2>&1
grep -A1 "^qwen" $OUT/bench_qwen.txt | cut -c1-200
METRICS=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,\
smsp__inst_executed.sum,smsp__cycles_active.avg,sm__cycles_elapsed.avg
timeout 110 ncu --clock-control none -k regex:grouped_gemm_kernel --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --section WarpStateStats --section SourceCounters --metrics $METRICS \
  -o $OUT/ncu_mxfp8_dequant python3 scripts/ncu_engine.py deepseek_v3_like 8 4096 \
  --engine mxfp8_dequant > $OUT/ncu_log.txt 2>&1
echo "ncu rc $?"
ncu -i $OUT/ncu_mxfp8_dequant.ncu-rep --page details --csv > $OUT/ncu_details.csv 2>&1
ncu -i $OUT/ncu_mxfp8_dequant.ncu-rep --page raw --csv > $OUT/ncu_raw.csv 2>&1
ncu -i $OUT/ncu_mxfp8_dequant.ncu-rep --page source --csv --print-source sass > $OUT/ncu_sass.csv 2>&1
grep -i "\"Duration\|hmma\|Issue Slots Busy\|Warp Cycles Per Issued" $OUT/ncu_details.csv | cut -c120-300
(cd $OUT && tar czf results.tgz pytest_*.txt bench_deepseek bench_qwen ncu_*.csv ncu_log.txt \
  && rm -rf pytest_*.txt bench_deepseek bench_qwen ncu_*.csv ncu_*.ncu-rep)
ls $OUT
