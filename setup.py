"""Build and install mok_megatron.

The CUDA extension (csrc/) is compiled for sm_90a when nvcc and a CUDA build of torch are
present; elsewhere the package installs without it and the GPU backend explains why it is
unavailable. MOK_BUILD_CUDA=0 skips the extension, MOK_BUILD_CUDA=1 makes its absence an error.
Install with `pip install --no-build-isolation -e .` so the build sees the installed torch.
"""

import glob
import os
import shutil

from setuptools import find_packages, setup


def library_headers_flags(cuda_home):
    """A toolkit with only the compiler (as on our CI) lacks the CUDA library headers that
    torch's CUDA headers include (cusparse.h, cublas_v2.h, ...); pip's nvidia-* wheels ship
    them. Search them after the toolkit's own headers (-isystem), so those still win."""
    if cuda_home and os.path.exists(os.path.join(cuda_home, "include", "cusparse.h")):
        return []
    import site

    for root in site.getsitepackages():
        for sub in ("nvidia/cu13/include", "nvidia/cusparse/include"):
            path = os.path.join(root, sub)
            if os.path.exists(os.path.join(path, "cusparse.h")):
                return ["-isystem", path]
    return []


def ensure_cuda_home():
    """torch finds the toolkit through `which nvcc`; where nvcc is a wrapper script outside
    the toolkit (/usr/local/bin/nvcc on our machines), point CUDA_HOME at the real one."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    guess = os.path.dirname(os.path.dirname(nvcc)) if nvcc else None
    if guess and os.path.isdir(os.path.join(guess, "lib64")):
        return
    for candidate in sorted(glob.glob("/usr/local/cuda*"), reverse=True):
        if os.path.exists(os.path.join(candidate, "bin", "nvcc")):
            os.environ["CUDA_HOME"] = candidate
            return


def cuda_extension():
    wanted = os.environ.get("MOK_BUILD_CUDA", "auto")
    if wanted == "0":
        return [], {}
    ensure_cuda_home()
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        if wanted == "1":
            raise
        return [], {}
    have_cuda = torch.version.cuda is not None and (CUDA_HOME or shutil.which("nvcc"))
    if not have_cuda:
        if wanted == "1":
            raise RuntimeError("MOK_BUILD_CUDA=1 but no nvcc / CUDA build of torch was found")
        print("mok_megatron: no nvcc or CUDA torch; installing without the CUDA extension")
        return [], {}
    here = os.path.dirname(os.path.abspath(__file__))
    extra_includes = library_headers_flags(CUDA_HOME)
    sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
    sources += sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    ext = CUDAExtension(
        name="mok_megatron._C",
        sources=sources,
        include_dirs=[os.path.join(here, "csrc")],
        extra_compile_args={
            "cxx": ["-O3", "-std=c++17"] + extra_includes,
            "nvcc": extra_includes + [
                "-O3",
                "-std=c++17",
                "-gencode=arch=compute_90a,code=sm_90a",
                "--expt-relaxed-constexpr",
                "-lineinfo",
            ],
        },
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = cuda_extension()

setup(
    name="mok_megatron",
    version="0.1.0",
    description="Fused MoE dispatch + experts + combine for Megatron-Core on Hopper",
    license="Apache-2.0",
    packages=find_packages(include=["mok_megatron", "mok_megatron.*"]),
    package_data={"mok_megatron.megatron": ["*.pth"]},
    python_requires=">=3.12",
    install_requires=[
        "torch>=2.11",
        "megatron-core>=0.17.1,<0.20",  # supported; CI tests those in scripts/versions.sh
        "PyYAML>=6",
        "pybind11>=2.12",
    ],
    extras_require={"test": ["pytest>=8"], "bench": ["matplotlib"], "te": ["transformer_engine"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
