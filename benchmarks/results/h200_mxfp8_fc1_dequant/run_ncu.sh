#!/bin/bash
# Session 19, call 2 (one H200): Nsight Compute on the engines the FP8 recipes run, at
# DeepSeek-V3-like E=8 T=4096 (compute-bound; FC1 1.92 TFLOP, FC2 0.96): our BF16 tile engine,
# the same engine dequantizing MXFP8 weight codes in shared memory, and the blockwise FP8
# engine - FC1 and FC2 each, counters at the machine's own clocks, per-instruction stall
# samples (source page) - then the two Megatron GPU test files whose last run (session 18)
# was cut by its call's time limit.
# Output: $OUT. Run from the repository root with the extension built:
#   bash benchmarks/results/h200_mxfp8_fc1_dequant/run_ncu.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
METRICS=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,\
smsp__inst_executed.sum,smsp__cycles_active.avg,sm__cycles_elapsed.avg
for engine in mxfp8_dequant bf16 blockwise; do
  timeout 100 ncu --clock-control none -k regex:grouped_gemm_kernel --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section WarpStateStats --section SourceCounters --metrics $METRICS \
    -o $OUT/ncu_$engine python3 scripts/ncu_engine.py deepseek_v3_like 8 4096 --engine $engine \
    > $OUT/ncu_${engine}_log.txt 2>&1
  echo "$engine: ncu rc $?"
  ncu -i $OUT/ncu_$engine.ncu-rep --page details --csv > $OUT/ncu_${engine}_details.csv 2>&1
  ncu -i $OUT/ncu_$engine.ncu-rep --page raw --csv > $OUT/ncu_${engine}_raw.csv 2>&1
  ncu -i $OUT/ncu_$engine.ncu-rep --page source --csv --print-source sass \
    > $OUT/ncu_${engine}_sass.csv 2>&1
  grep -i "Duration\|Tensor\|gmma\|Issue Slots\|Warp Cycles Per Issued\|Shared Memory" \
    $OUT/ncu_${engine}_details.csv | cut -c120-260 | head -16
done
for case in test_megatron_moe_layer_vs_reference:170 test_megatron_graph_replay:150; do
  f=${case%:*}
  timeout ${case#*:} python3 -m pytest -q -p no:cacheprovider tests/gpu/$f.py > $OUT/pytest_$f.txt 2>&1
  rc=$?
  echo "$f: $(tail -1 $OUT/pytest_$f.txt) [rc $rc]"
done
