#!/bin/bash
# Session 28, call 5 (one GPU; calls 3 and 4 in one, in order of what decides most, for the
# device time left): the FP8 engine's tests with CTA pairs; bench_gemm at DeepSeek E=8 T=4096
# (ring/order/pair variants, cuBLAS); Nsight Compute on cuBLAS's blockwise kernel and on our
# engine without and with pairs (dense FC1 32768 x 4096 x 7168); the regressions (the blockwise
# layer's tests, both FP8 megakernels included; BF16's forward megakernel); bench_gemm at MoK's
# ep64. $OUT/call5.tar.gz, rewritten after every step.
#   bash benchmarks/results/h200_session28/call5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call5; mkdir -p $R
save() { tar czf $OUT/call5.tar.gz -C /tmp call5; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
run() {  # name, time limit, pytest arguments...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -m pytest -q -s -p no:cacheprovider "$@" > $R/pytest_$name.txt 2>&1
  echo "$name: $(tail -n 1 $R/pytest_$name.txt) [rc $?]"
  grep -E "^(FAILED|ERROR)" $R/pytest_$name.txt | head -8 | cut -c1-220
  save
}
gemm() {  # name, bench_gemm model arguments...
  local name=$1; shift
  (cd scripts && timeout 120 python3 bench_gemm.py --fp8-blockwise "$@" --tokens 4096 \
    --out $R/gemm_$name.json > $R/gemm_$name.txt 2>&1)
  echo "bench_gemm $name rc $?"
  grep -E "FP8 blockwise|same blockwise|ring depth" $R/gemm_$name.txt | cut -c1-330
  save
}
ncu_one() {  # name, cublas_kernels.py arguments...
  local who=$1; shift
  timeout 90 ncu --clock-control none -k regex:"fp8_grouped_gemm|nvjet" --launch-skip 2 \
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
    "^(Duration|SM Frequency|L2 Cache Throughput|L1/TEX Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|L2 Hit Rate|Mem Busy|Max Bandwidth|No Eligible|Eligible Warps Per|Warp Cycles Per Issued|Cluster Size|Grid Size) " | head -20
  save
}
run fp8_gemm 60 tests/gpu/test_fp8_blockwise_kernels.py -k grouped_gemm
gemm deepseek_e8 --models deepseek_v3_like --variants full --ep 32
ncu_one blockwise --only blockwise
ncu_one ours --only ours
ncu_one ours_pairs --only ours --cluster-ctas 2
run blockwise_layer 150 tests/gpu/test_fp8_blockwise_layer.py
run bf16_forward_mk 60 tests/gpu/test_megakernel.py
gemm mok_ep64 --models mok_bench --variants ep64
