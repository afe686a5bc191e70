#!/usr/bin/env bash
# The main job, from a fresh machine: set up (scripts/setup_env.sh), then run the MoE layer
# across an expert-parallel group, forward and backward, and check it against an independent
# float64 per-token computation (mok_megatron/demo.py; arguments are passed on to it).
# CPU only: EP=2 over gloo. With CUDA GPUs: one process per GPU, up to 4, over NCCL.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m mok_megatron.demo "$@"
