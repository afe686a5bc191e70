#!/usr/bin/env bash
# Set up everything on a fresh machine, idempotently: a Python 3.12 virtual environment in
# .venv, torch, and this package installed in place with its test and bench extras. The
# package build compiles csrc/ when nvcc and a CUDA build of torch are present (setup.py).
# Running it again reuses .venv and only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0

say() { echo "setup_env: $*"; }

# A python3.12 that runs: on PATH, or installed by pyenv (whose shim may exist without a
# selected 3.12, hence the trial run).
find_python() {
    if command -v python3.12 >/dev/null && python3.12 -c "" 2>/dev/null; then
        command -v python3.12
        return
    fi
    local roots=("$HOME/.pyenv")
    if command -v pyenv >/dev/null; then roots=("$(pyenv root)" "${roots[@]}"); fi
    local root candidate
    for root in "${roots[@]}"; do
        for candidate in "$root"/versions/3.12*/bin/python; do
            if [ -x "$candidate" ]; then echo "$candidate"; return; fi
        done
    done
    return 1
}

is_python312() { "$1" -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))" 2>/dev/null; }

if [ -x .venv/bin/python ] && is_python312 .venv/bin/python; then
    say "reusing .venv ($(.venv/bin/python --version))"
else
    if [ -e .venv ]; then
        say "removing .venv: it is not a working Python 3.12 environment"
        rm -rf .venv
    fi
    python=$(find_python) || { say "no Python 3.12 found (PATH, pyenv)"; exit 1; }
    say "creating .venv with $python ($("$python" --version))"
    "$python" -m venv .venv
fi

pip() { .venv/bin/python -m pip "$@"; }

say "upgrading pip"
pip install --quiet --upgrade pip
say "installing torch==$TORCH_VERSION and the build tools (setuptools, wheel, ninja)"
pip install --quiet "torch==$TORCH_VERSION" "setuptools>=64" wheel ninja
say "installing mok_megatron (editable, extras test and bench)"
pip install --quiet --no-build-isolation -e ".[test,bench]"

.venv/bin/python - <<'PY'
import importlib.util
import torch
import mok_megatron
cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
ext = "built" if importlib.util.find_spec("mok_megatron._C") else "not built"
print(f"setup_env: ready: torch {torch.__version__} ({cuda}), {gpus} GPU(s) visible, "
      f"mok_megatron {mok_megatron.__version__}, CUDA extension {ext}")
PY
