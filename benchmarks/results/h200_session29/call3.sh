#!/bin/bash
# Session 29, call 3 (one GPU): call 2's steps on the grouped GEMM whose two consumer
# warpgroups take turns issuing their MMAs (named barriers kMmaTurnBarrier + c): the FP8 kernels'
# tests, bench_gemm at DeepSeek E=8 and MoK's ep64 T=4096, the blockwise layer's tests, the
# layer at the EP64-equivalents T=4096, Nsight Compute on the engine. $OUT/call3.tar.gz,
# rewritten after every step.
#   bash benchmarks/results/h200_session29/call3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call3; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call3.tar.gz -C /tmp call3; }
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
  grep -E "FP8 blockwise|same blockwise|ring depth| T= " $R/gemm_$name.txt | cut -c1-330 | head -16
  save
}
run fp8_kernels 120 tests/gpu/test_fp8_blockwise_kernels.py
gemm deepseek_e8 --models deepseek_v3_like --variants full --ep 32
gemm mok_ep64 --models mok_bench --variants ep64
run blockwise_layer 170 tests/gpu/test_fp8_blockwise_layer.py
timeout 170 torchrun --nproc-per-node 1 scripts/bench_moe.py --fp8-blockwise \
  --fp8-blockwise-megakernel --models deepseek_v3_like mok_bench --variants ep64 \
  --tokens 4096 --iters 5 --warmup 2 --out $R/bench_ep64 > $R/bench_ep64.txt 2>&1
echo "bench ep64 rc $?"
grep -A6 -E "^(deepseek|mok)" $R/bench_ep64.txt | grep -v "kept from" | cut -c1-230
save
timeout 90 ncu --clock-control none -k regex:"fp8_grouped_gemm" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section InstructionStats -o $R/ncu_ours \
  python3 benchmarks/diagnostics/cublas_kernels.py 32768 4096 7168 --ncu --only ours \
  > $R/ncu_ours_log.txt 2>&1
echo "ncu rc $?"
ncu -i $R/ncu_ours.ncu-rep --page details --csv > $R/ncu_ours_details.csv 2>&1
ncu -i $R/ncu_ours.ncu-rep --page raw --csv > $R/ncu_ours_raw.csv 2>&1
rm -f $R/ncu_ours.ncu-rep
awk -F'","' '{print $13" | "$14" | "$15}' $R/ncu_ours_details.csv | grep -E \
  "^(Duration|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|Issued Instructions|Warp Cycles Per Issued) " | head -12
save
