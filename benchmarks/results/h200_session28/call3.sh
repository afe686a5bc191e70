#!/bin/bash
# Session 28, call 3 (one H200), branch fp8-pairs-m (fp8-ring-depth + CTA pairs sharing weight
# tiles, cuBLAS's 2 x 1 clusters): the FP8 engine's tests with pairs (the same bits, refusals);
# bench_gemm at DeepSeek E=8 T=4096 and MoK's ep64 with the ring/order/pair variants; Nsight
# Compute on our engine (single CTAs and pairs) and cuBLAS's blockwise kernel for the same
# dense FC1 (32768 x 4096 x 7168): L2 and shared-memory traffic, tensor pipe, issue, stalls,
# SASS with samples. Predictions: docs/perf-log.md "Session 28". $OUT/call3.tar.gz, rewritten
# after every step.
#   bash benchmarks/results/h200_session28/call3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call3; mkdir -p $R
save() { tar czf $OUT/call3.tar.gz -C /tmp call3; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
timeout 90 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_fp8_blockwise_kernels.py \
  -k "grouped_gemm" > $R/pytest_fp8_gemm.txt 2>&1
echo "fp8_gemm: $(tail -n 1 $R/pytest_fp8_gemm.txt)"
grep -E "^(FAILED|ERROR)" $R/pytest_fp8_gemm.txt | head -8 | cut -c1-220
save
for case in "deepseek_v3_like full --ep 32" "mok_bench ep64"; do
  set -- $case
  name=$1_$2
  (cd scripts && timeout 150 python3 bench_gemm.py --fp8-blockwise --models $1 --variants $2 \
    ${3:-} ${4:-} --tokens 4096 --out $R/gemm_$name.json > $R/gemm_$name.txt 2>&1)
  echo "bench_gemm $name rc $?"
  grep -E "FP8 blockwise|same blockwise|ring depth" $R/gemm_$name.txt | cut -c1-330
  save
done
ncu_one() {  # name, cublas_kernels.py arguments...
  local who=$1; shift
  timeout 100 ncu --clock-control none -k regex:"fp8_grouped_gemm|nvjet" --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Chart --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section LaunchStats --section SchedulerStats \
    --section SourceCounters --section InstructionStats \
    -o $R/ncu_$who python3 benchmarks/diagnostics/cublas_kernels.py 32768 4096 7168 --ncu "$@" \
    > $R/ncu_${who}_log.txt 2>&1
  echo "$who: ncu rc $?"
  ncu -i $R/ncu_$who.ncu-rep --page details --csv > $R/ncu_${who}_details.csv 2>&1
  ncu -i $R/ncu_$who.ncu-rep --page raw --csv > $R/ncu_${who}_raw.csv 2>&1
  ncu -i $R/ncu_$who.ncu-rep --page source --csv --print-source sass > $R/ncu_${who}_sass.csv 2>&1
  rm -f $R/ncu_$who.ncu-rep
  awk -F'","' '{print $13" | "$14" | "$15}' $R/ncu_${who}_details.csv | grep -E \
    "^(Duration|SM Frequency|L2 Cache Throughput|L1/TEX Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|L2 Hit Rate|Mem Busy|Max Bandwidth|No Eligible|Eligible Warps Per|Warp Cycles Per Issued|Cluster Size|Grid Size|Shared Memory Configuration Size) " | head -20
  save
}
ncu_one blockwise --only blockwise
ncu_one ours --only ours
ncu_one ours_pairs --only ours --cluster-ctas 2
