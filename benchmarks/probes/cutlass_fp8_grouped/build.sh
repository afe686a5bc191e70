#!/usr/bin/env bash
# Builds the CUTLASS grouped blockwise GEMM baseline (README.md) into
# .carry/cutlass_fp8_grouped/ (git-ignored): nvidia-cutlass 4.2.0's wheel from the package
# registry (only its C++ headers are used), then setup.py through torch's extension builder.
#   PYTHON=/path/to/python benchmarks/probes/cutlass_fp8_grouped/build.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
# As a path that still holds after the cd below (PYTHON may be relative, e.g. .venv/bin/python).
PY=$(command -v "${PYTHON:-python3}")
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
DEST=${DEST:-$ROOT/.carry/cutlass_fp8_grouped}
WORK=$ROOT/build/cutlass_fp8_grouped
CUTLASS_VERSION=4.2.0
HEADERS=$WORK/nvidia-cutlass-$CUTLASS_VERSION
SOURCE=cutlass_library/source

if [ ! -d "$HEADERS/$SOURCE/include/cutlass" ]; then
    mkdir -p "$WORK"
    "$PY" -m pip download -q --no-deps "nvidia-cutlass==$CUTLASS_VERSION" -d "$WORK"
    unzip -q -o "$WORK"/nvidia_cutlass-"$CUTLASS_VERSION"*.whl "$SOURCE/include/*" \
        "$SOURCE/tools/util/include/*" -d "$HEADERS"
fi
export CUTLASS_DIR=$HEADERS/$SOURCE
# The toolkit of the nvcc on PATH (a wrapper script outside it: /usr/local/cuda).
if [ -z "${CUDA_HOME:-}" ]; then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    [ -d "$CUDA_HOME/lib64" ] || CUDA_HOME=/usr/local/cuda
fi
export CUDA_HOME
export MAX_JOBS=${MAX_JOBS:-2}
mkdir -p "$DEST"
cd "$WORK"
"$PY" "$ROOT/benchmarks/probes/cutlass_fp8_grouped/setup.py" -q build_ext \
    --build-lib "$DEST" --build-temp "$WORK/temp"
strip --strip-debug "$DEST"/cutlass_fp8_grouped*.so
ls -l "$DEST"
