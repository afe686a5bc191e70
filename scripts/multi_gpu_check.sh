#!/usr/bin/env bash
# What a multi-GPU machine is asked first: the torchrun suite (tests/dist: every path and
# recipe against the reference at EP = every visible GPU, bit-identical reruns and settings,
# graph replay, a killed and a stalled rank), the side-by-side benchmark with the megakernels
# (eager and graph-replayed), Megatron's training loop under mok and alltoall (loss curves and
# tokens/s), the knob sweep, and the one-GPU suite. Run from the repository root with the
# package importable (extension built, megatron-core installed); each step's output goes to
# OUT_DIR and a summary line to stdout.
#     scripts/multi_gpu_check.sh OUT_DIR
# Where a machine is lent 10 minutes at a time, STEPS picks the steps of one run (default: all,
# in this order) and each step has a time limit (seconds, STEP_TIMEOUT overrides all):
#     STEPS="dist failures" scripts/multi_gpu_check.sh OUT_DIR
#     STEPS="bench" scripts/multi_gpu_check.sh OUT_DIR
#     STEPS="graph train sweep" scripts/multi_gpu_check.sh OUT_DIR
set -uo pipefail
out=${1:?usage: scripts/multi_gpu_check.sh OUT_DIR}
py=${PYTHON:-python3}
steps=${STEPS:-dist failures bench graph train sweep gpu}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset CUDA_DEVICE_MAX_CONNECTIONS  # the one-GPU suite's emulated groups need concurrent streams
gpus=$("$py" -c "import torch; print(torch.cuda.device_count())")
# With one GPU the torchrun suite would skip every test and still exit 0.
[ "$gpus" -ge 2 ] || { echo "multi_gpu_check: $gpus GPU(s) visible, needs at least 2" >&2; exit 2; }
mkdir -p "$out"
status=0
run="$py -m torch.distributed.run --nproc-per-node $gpus"

step() {  # name, default time limit, log file, command...
    local name=$1 limit=${STEP_TIMEOUT:-$2} log=$3
    shift 3
    case " $steps " in *" $name "*) ;; *) return ;; esac
    local start=$SECONDS
    timeout "$limit" "$@" > "$log" 2>&1
    local rc=$?
    echo "$name (rc $rc, $((SECONDS - start)) s): $(tail -n 1 "$log")"
    [ "$rc" -eq 0 ] || status=1
}

step dist 420 "$out/pytest_dist_ep$gpus.txt" \
    $run -m pytest tests/dist -q -p no:cacheprovider --deselect \
    tests/dist/test_failures_dist.py
step failures 300 "$out/pytest_failures_ep$gpus.txt" \
    $run -m pytest tests/dist/test_failures_dist.py -q -s -p no:cacheprovider
step bench 540 "$out/bench_ep$gpus.txt" \
    $run scripts/bench_moe.py --megakernel --mxfp8 --mxfp8-megakernel --mxfp8-megakernels \
    --fp8-blockwise --fp8-blockwise-megakernel --fp8-blockwise-megakernels \
    --comm-sms 12 --models qwen3_30b_a3b_like deepseek_v3_like mok_bench \
    --tokens 2048 4096 8192 --iters 20 --warmup 5 --out "$out/bench_ep$gpus"
# The graph-replayed figures: a separate step, so a capture problem at EP > 1 leaves the eager
# figures above standing.
step graph 540 "$out/bench_ep${gpus}_graph.txt" \
    $run scripts/bench_moe.py --megakernel --cuda-graph --comm-sms 12 \
    --models qwen3_30b_a3b_like deepseek_v3_like mok_bench \
    --tokens 2048 4096 8192 --iters 20 --warmup 5 --out "$out/bench_ep${gpus}_graph"
step train 420 "$out/train_ep$gpus.txt" \
    "$py" scripts/train_compare.py --nproc "$gpus" --steps 50 --out "$out/train_ep$gpus"
step sweep 420 "$out/sweep_ep$gpus.txt" \
    $run scripts/sweep_knobs.py --model deepseek_v3_like --variant ep64 --tokens 4096 \
    --comm-sms 8 16 24 32 --comm-sms-backward 8 16 32 \
    --out "$out/bf16_deepseek_v3_like_ep64_ep$gpus.yaml"
step gpu 540 "$out/pytest_gpu.txt" "$py" -m pytest tests/gpu -q -p no:cacheprovider
exit $status
