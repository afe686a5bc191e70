"""Compiles the CUTLASS grouped blockwise GEMM baseline (README.md) as a torch extension,
`cutlass_fp8_grouped`, for sm_90a. CUTLASS_DIR: a folder holding CUTLASS's include/ and
tools/util/include/ (build.sh unpacks nvidia-cutlass's wheel into one). Run by build.sh."""

import os
import site

from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
CUTLASS = os.environ["CUTLASS_DIR"]


def cuda_library_headers():
    """torch's CUDA headers include cusparse.h and cublas_v2.h, which a compiler-only toolkit
    lacks and pip's nvidia wheels ship: search those after the toolkit's own headers."""
    if CUDA_HOME and os.path.exists(os.path.join(CUDA_HOME, "include", "cusparse.h")):
        return []
    for root in site.getsitepackages():
        path = os.path.join(root, "nvidia", "cu13", "include")
        if os.path.exists(os.path.join(path, "cusparse.h")):
            return ["-isystem", path]
    return []


extra = cuda_library_headers()
setup(
    name="cutlass_fp8_grouped",
    ext_modules=[CUDAExtension(
        name="cutlass_fp8_grouped",
        sources=[os.path.join(HERE, f) for f in ("bindings.cpp", "cooperative.cu", "pingpong.cu")],
        include_dirs=[HERE, os.path.join(CUTLASS, "include"),
                      os.path.join(CUTLASS, "tools", "util", "include")],
        extra_compile_args={
            "cxx": ["-O3", "-std=c++17"] + extra,
            "nvcc": extra + ["-O3", "-std=c++17", "-DNDEBUG", "--expt-relaxed-constexpr",
                             "--expt-extended-lambda", "-gencode=arch=compute_90a,code=sm_90a"],
        },
    )],
    cmdclass={"build_ext": BuildExtension},
)
