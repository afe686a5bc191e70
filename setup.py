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


def cuda_extension():
    wanted = os.environ.get("MOK_BUILD_CUDA", "auto")
    if wanted == "0":
        return [], {}
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
    sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
    sources += sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    ext = CUDAExtension(
        name="mok_megatron._C",
        sources=sources,
        include_dirs=[os.path.join(here, "csrc")],
        extra_compile_args={
            "cxx": ["-O3", "-std=c++17"],
            "nvcc": [
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
    package_data={"mok_megatron": ["configs/**/*.yaml"]},
    python_requires=">=3.12",
    install_requires=[
        "torch>=2.11",
        "megatron-core==0.19.2",
        "PyYAML>=6",
        "pybind11>=2.12",
    ],
    extras_require={"test": ["pytest>=8"], "bench": ["matplotlib"], "te": ["transformer_engine"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
