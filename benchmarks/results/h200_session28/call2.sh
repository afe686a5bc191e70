#!/bin/bash
# Session 28, call 2 (one H200), branch fp8-ring-depth: Nsight Compute on our FP8 engine and on
# cuBLAS's blockwise kernel (nvjet 128x128x128, 6 stages, 2x1 cluster) for the same dense FC1
# (32768 x 4096 x 7168), side by side: L2 and shared-memory traffic, tensor pipe, issue and
# stall reasons and each kernel's SASS with its samples (cuBLAS's k-loop: how many instructions
# per k-block, how it promotes) - the ring depth made no difference (call 1), so which resource binds ours and
# not cuBLAS's; then the regressions of the ring/tile-order change (the blockwise layer's
# tests, both FP8 megakernels included; BF16's forward megakernel, whose tile groups moved);
# then the layer under bf16 and fp8_blockwise (separate and forward megakernel) at 4096 tokens,
# the EP64-equivalents (DeepSeek-V3, MoK's bench model).
# $OUT/call2.tar.gz, rewritten after every step.
#   bash benchmarks/results/h200_session28/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; mkdir -p $R
save() { tar czf $OUT/call2.tar.gz -C /tmp call2; }
for who in ours blockwise; do
  timeout 110 ncu --clock-control none -k regex:"fp8_grouped_gemm|nvjet" --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Chart --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section LaunchStats --section SchedulerStats \
    --section SourceCounters --section InstructionStats \
    -o $R/ncu_$who python3 benchmarks/diagnostics/cublas_kernels.py 32768 4096 7168 --ncu \
    --only $who > $R/ncu_${who}_log.txt 2>&1
  echo "$who: ncu rc $?"
  ncu -i $R/ncu_$who.ncu-rep --page details --csv > $R/ncu_${who}_details.csv 2>&1
  ncu -i $R/ncu_$who.ncu-rep --page raw --csv > $R/ncu_${who}_raw.csv 2>&1
  ncu -i $R/ncu_$who.ncu-rep --page source --csv --print-source sass > $R/ncu_${who}_sass.csv 2>&1
  rm -f $R/ncu_$who.ncu-rep
  awk -F'","' '{print $13" | "$14" | "$15}' $R/ncu_${who}_details.csv | grep -E \
    "Duration|SM Frequency|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|Executed Ipc A|L2 Hit Rate|Shared Memory|Mem Busy|Max Bandwidth|No Eligible|Eligible Warps|Warp Cycles Per Issued|Registers|Cluster|Grid Size|Block Size|Dynamic Shared" | head -40
  save
done
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -s -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt) [rc $?]"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
run blockwise_layer 150 tests/gpu/test_fp8_blockwise_layer.py
run bf16_forward_mk 60 tests/gpu/test_megakernel.py
timeout 210 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --models deepseek_v3_like mok_bench --variants ep64 \
  --tokens 4096 --iters 5 --warmup 2 --out $R/bench_ep64 > $R/bench_ep64.txt 2>&1
echo "bench ep64 rc $?"
grep -A6 -E "^(deepseek|mok_bench)" $R/bench_ep64.txt | grep -v "kept from" | cut -c1-230
save
