#!/usr/bin/env bash
# Set up everything on a fresh machine, idempotently: a Python 3.12 virtual environment in
# .venv, torch, megatron-core and this package installed in place with its test and bench
# extras, and the CUDA extension compiled from csrc/ when nvcc and a CUDA build of torch are
# present (setup.py).
#
# Run again, it redoes only what changed (scripts/setup_state.py decides, from a stamp in
# .venv): nothing when nothing did (seconds); the pip installs when setup.py, pyproject.toml,
# a requested version or the environment changed; the extension when csrc/, setup.py or the
# toolchain changed, through ninja, which recompiles only the changed sources (its objects stay
# in build/). Python files need nothing: the install is editable.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/versions.sh
STAMP=.venv/mok-setup-stamp.json

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
# Without PYTHONPATH, so that it sees the environment as the installed package does.
state() { env -u PYTHONPATH .venv/bin/python scripts/setup_state.py "$1" "$STAMP" "${@:2}"; }

BUILD_TOOLS=("setuptools>=64" wheel ninja)
PACKAGE=(-e ".[test,bench]" "megatron-core==$MEGATRON_CORE_VERSION")
BRIDGE=("megatron-bridge==$MEGATRON_BRIDGE_VERSION" omegaconf)

plan=$(state begin install "torch==$TORCH_VERSION" "${BUILD_TOOLS[@]}" "${PACKAGE[@]}" \
    --no-deps "${BRIDGE[@]}")
if [ "$plan" = current ]; then
    say "packages: up to date"
else
    say "packages: installing (${plan#stale: })"
    pip install --quiet --upgrade pip
    say "installing torch==$TORCH_VERSION and the build tools (${BUILD_TOOLS[*]})"
    pip install --quiet "torch==$TORCH_VERSION" "${BUILD_TOOLS[@]}"
    say "installing megatron-core==$MEGATRON_CORE_VERSION and mok_megatron (editable, [test,bench])"
    # The extension is built below, where its objects are kept between runs.
    MOK_BUILD_CUDA=0 pip install --quiet --no-build-isolation "${PACKAGE[@]}"
    say "installing ${BRIDGE[*]} without their dependencies (for the Megatron-Bridge tests)"
    pip install --quiet --no-deps "${BRIDGE[@]}"
    state done install
fi

plan=$(state begin extension)
if [ "$plan" = current ]; then
    say "CUDA extension: up to date"
else
    say "CUDA extension: building (${plan#stale: })"
    # A failed build must not leave the previous one importable.
    rm -f mok_megatron/_C.so mok_megatron/_C.*.so
    # --force: setuptools would skip the build when only a header changed; ninja then
    # recompiles exactly the sources whose inputs changed.
    .venv/bin/python setup.py --quiet build_ext --inplace --force
    state done extension
fi

.venv/bin/python - <<'PY'
import importlib.metadata
import importlib.util
import torch
import mok_megatron
cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
ext = "built" if importlib.util.find_spec("mok_megatron._C") else "not built"
megatron = importlib.metadata.version("megatron-core")
print(f"setup_env: ready: torch {torch.__version__} ({cuda}), {gpus} GPU(s) visible, "
      f"megatron-core {megatron}, mok_megatron {mok_megatron.__version__}, CUDA extension {ext}")
PY
