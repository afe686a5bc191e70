#!/usr/bin/env bash
# Builds DeepGEMM (deepseek-ai/DeepGEMM, a baseline of scripts/bench_gemm.py --fp8-baselines)
# into .carry/deep_gemm_site/deep_gemm (git-ignored): its Python package, its C++ extension
# (_C, which compiles the GEMM kernels at run time with nvcc and links NVRTC) and the CUDA
# headers those kernels include (DeepGEMM's own, CUTLASS's cute/ and cutlass/).
#   DEEPGEMM_SRC=/path/to/DeepGEMM PYTHON=/path/to/python benchmarks/probes/deep_gemm_build/build.sh
# DEEPGEMM_SRC: a checkout of commit 54e22612409371d6364144b69086735beb54e98b (2026-06-23,
# version 2.6.1) with its submodules filled in (third-party/cutlass at f3fde583,
# third-party/fmt at 553ec11e); the registry's deep-gemm (1.0.0, 2025-02) predates the API used.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${PYTHON:-python3}
SRC=${DEEPGEMM_SRC:?a DeepGEMM checkout with submodules}
DEST=${DEST:-$ROOT/.carry/deep_gemm_site}
[ -f "$SRC/third-party/cutlass/include/cute/tensor.hpp" ] || { echo "no submodules in $SRC"; exit 1; }
[ -f "$SRC/third-party/fmt/include/fmt/format.h" ] || { echo "no submodules in $SRC"; exit 1; }

# The toolkit of the nvcc on PATH (a wrapper script outside it: /usr/local/cuda).
if [ -z "${CUDA_HOME:-}" ]; then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    [ -d "$CUDA_HOME/lib64" ] || CUDA_HOME=/usr/local/cuda
fi
export CUDA_HOME
# A compiler-only toolkit lacks cusparse.h (torch's CUDA headers include it) and
# libnvrtc.so: take both from pip's nvidia wheel beside torch.
NVIDIA=$("$PY" -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13'))")
LINK=$ROOT/build/deep_gemm_link
mkdir -p "$LINK"
ln -sf "$NVIDIA/lib/libnvrtc.so.13" "$LINK/libnvrtc.so"
export CPLUS_INCLUDE_PATH=$NVIDIA/include LIBRARY_PATH=$LINK
export DG_USE_LOCAL_VERSION=0 MAX_JOBS=${MAX_JOBS:-2}

cd "$SRC"
"$PY" setup.py build
BUILT=$(ls -d build/lib.*/deep_gemm)
strip --strip-debug "$BUILT"/_C*.so
mkdir -p "$DEST"
rm -rf "$DEST/deep_gemm"
cp -r "$BUILT" "$DEST/deep_gemm"

# Of CUTLASS's headers (27 MB) keep those DeepGEMM's Hopper kernels include: nvcc -MD over
# each sm90_* / smxx_* kernel header with the flags of its run-time compiler. (Its JIT cache
# hashes only its own deep_gemm/ headers, which all stay.)
INC=$DEST/deep_gemm/include
DEPS=$(mktemp -d)
for header in "$INC"/deep_gemm/impls/sm90_*.cuh "$INC"/deep_gemm/impls/smxx_*.cuh; do
    name=$(basename "$header" .cuh)
    echo "#include <deep_gemm/impls/$name.cuh>" > "$DEPS/$name.cu"
    "$CUDA_HOME/bin/nvcc" "$DEPS/$name.cu" -cubin -o /dev/null -std=c++20 -I"$INC" \
        --gpu-architecture=sm_90a --expt-relaxed-constexpr --expt-extended-lambda \
        --diag-suppress=39,161,174,177,186,940 -MD -MF "$DEPS/$name.d"
done
mkdir -p "$DEPS/include"
cat "$DEPS"/*.d | tr ' \\' '\n\n' | grep -E "^$INC/(cute|cutlass)/" | sort -u |
    while read -r header; do
        kept=$DEPS/include/${header#"$INC"/}
        mkdir -p "$(dirname "$kept")"
        cp "$header" "$kept"
    done
rm -rf "$INC/cute" "$INC/cutlass"
mv "$DEPS/include/cute" "$DEPS/include/cutlass" "$INC/"
rm -rf "$DEPS"
du -sh "$DEST"
