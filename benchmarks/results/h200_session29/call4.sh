#!/bin/bash
# Session 29, call 4 (one GPU): on call 2's consumer (the turns reverted), where the engine's
# warps wait, per SASS instruction: Nsight Compute's source counters (warp stall sampling) on
# the dense FC1 32768 x 4096 x 7168, after the FP8 kernels' tests. $OUT/call4.tar.gz.
#   bash benchmarks/results/h200_session29/call4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call4; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call4.tar.gz -C /tmp call4; }
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
timeout 60 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_fp8_blockwise_kernels.py \
  > $R/pytest_fp8_kernels.txt 2>&1
echo "fp8_kernels: $(tail -n 1 $R/pytest_fp8_kernels.txt)"
save
timeout 150 ncu --clock-control none -k regex:"fp8_grouped_gemm" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters \
  --section InstructionStats -o $R/ncu_ours \
  python3 benchmarks/diagnostics/cublas_kernels.py 32768 4096 7168 --ncu --only ours \
  > $R/ncu_ours_log.txt 2>&1
echo "ncu rc $?"
ncu -i $R/ncu_ours.ncu-rep --page details --csv > $R/ncu_ours_details.csv 2>&1
ncu -i $R/ncu_ours.ncu-rep --page source --csv --print-source sass > $R/ncu_ours_sass.csv 2>&1
rm -f $R/ncu_ours.ncu-rep
wc -l $R/ncu_ours_sass.csv
save
