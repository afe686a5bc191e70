#!/bin/bash
# Session 25, call 1 (one H200): what bounds the two FP8 engines that miss their targets.
#  1. the stage-ring probe (benchmarks/probes/weight_stream_probe.cu, launch fixed: its static
#     barriers count against the 227 KiB) - the codes ring's rate without MMAs;
#  2. Nsight Compute at the machine's clocks, per-instruction stall samples: the blockwise FP8
#     engine at DeepSeek E=8 T=4096 (compute-bound; FC1 870 TF/s against _scaled_mm's 1338),
#     the MXFP8 codes engine and the BF16 engine at DeepSeek E=256 T=2048 (weight-bound; the
#     codes FC1 at the BF16 one's k-block rate on half the bytes);
#  3. the GPU tests of the quantizers the session-24 review touched.
# Output: $OUT. From the repository root with the extension built:
#   bash benchmarks/results/h200_session25/call1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $OUT/gpu.txt
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc -o /tmp/stream_probe \
  benchmarks/probes/weight_stream_probe.cu && timeout 90 /tmp/stream_probe > $OUT/probe.txt 2>&1
echo "probe rc $?"; cat $OUT/probe.txt
METRICS=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
lts__t_sectors.sum,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,\
l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg
for spec in "blockwise 8 4096" "mxfp8_dequant 256 2048" "bf16 256 2048"; do
  set -- $spec
  name=${1}_E${2}_T${3}
  timeout 150 ncu --clock-control none -k regex:grouped_gemm_kernel --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section SourceCounters --metrics $METRICS \
    -o $OUT/ncu_$name python3 scripts/ncu_engine.py deepseek_v3_like $2 $3 --engine $1 \
    > $OUT/ncu_${name}_log.txt 2>&1
  echo "$name: ncu rc $?"
  ncu -i $OUT/ncu_$name.ncu-rep --page details --csv > $OUT/ncu_${name}_details.csv 2>&1
  ncu -i $OUT/ncu_$name.ncu-rep --page raw --csv > $OUT/ncu_${name}_raw.csv 2>&1
  ncu -i $OUT/ncu_$name.ncu-rep --page source --csv --print-source sass \
    > $OUT/ncu_${name}_sass.csv 2>&1
  grep -i '"Duration"\|Tensor\|Issue Slots Busy\|Warp Cycles Per Issued\|L2 Cache Throughput\|DRAM Throughput' \
    $OUT/ncu_${name}_details.csv | awk -F'","' '{print $5" | "$13" | "$15}' | cut -c1-160
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mxfp8_kernels.py \
  tests/gpu/test_fp8_blockwise_kernels.py > $OUT/pytest_quant.txt 2>&1
echo "quant tests: $(tail -1 $OUT/pytest_quant.txt) [rc $?]"
