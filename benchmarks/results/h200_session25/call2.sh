#!/bin/bash
# Session 25, call 2 (one H200): the blockwise FP8 engine in 2-CTA clusters (MOK_FP8_PAIRS=1:
# the two n-blocks of an m-block share their A loads, multicast) against the single-CTA
# schedule - bits, tests, bench_gemm side by side - then what call 1 lost to the file count
# (the codes engine's ncu, the stage-ring probe). Everything lands in $OUT/call2.tar.gz.
#   bash benchmarks/results/h200_session25/call2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call2; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_blockwise_kernels.py > $R/pytest_kernels.txt 2>&1
echo "kernel tests: $(tail -1 $R/pytest_kernels.txt)"
MOK_FP8_PAIRS=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_blockwise_layer.py > $R/pytest_layer_pairs.txt 2>&1
echo "layer tests, pairs: $(tail -1 $R/pytest_layer_pairs.txt)"
cd scripts
timeout 150 python3 bench_gemm.py --fp8-blockwise --models deepseek_v3_like --variants full ep64 --ep 32 \
  --tokens 4096 --out $R/gemm_pairs_e8.json 2>&1 | tee $R/gemm_pairs_e8.txt | grep -v "^ *$"
timeout 150 python3 bench_gemm.py --fp8-blockwise --models deepseek_v3_like mok_bench --variants full --ep 1 \
  --tokens 2048 --out $R/gemm_pairs_e256.json 2>&1 | tee $R/gemm_pairs_e256.txt | grep -v "^ *$"
cd ..
ncu_one() {  # name, env, engine, E, T
  env $2 timeout 150 ncu --clock-control none -k regex:grouped_gemm_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section SourceCounters \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second \
    -o $R/ncu_$1 python3 scripts/ncu_engine.py deepseek_v3_like $4 $5 --engine $3 > $R/ncu_$1_log.txt 2>&1
  echo "$1: ncu rc $?"
  ncu -i $R/ncu_$1.ncu-rep --page details --csv > $R/ncu_$1_details.csv 2>&1
  ncu -i $R/ncu_$1.ncu-rep --page raw --csv > $R/ncu_$1_raw.csv 2>&1
  ncu -i $R/ncu_$1.ncu-rep --page source --csv --print-source sass > $R/ncu_$1_sass.csv 2>&1
  rm -f $R/ncu_$1.ncu-rep
}
ncu_one codes_fc1_E256_T2048 MOK_NONE=1 mxfp8_dequant 256 2048
ncu_one blockwise_fc1_E8_T4096 MOK_NONE=1 blockwise 8 4096
ncu_one blockwise_pairs_fc1_E8_T4096 MOK_FP8_PAIRS=1 blockwise 8 4096
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc -o /tmp/stream_probe \
  benchmarks/probes/weight_stream_probe.cu && timeout 90 /tmp/stream_probe > $R/probe.txt 2>&1
echo "probe rc $?"; head -40 $R/probe.txt
tar czf $OUT/call2.tar.gz -C /tmp call2
