"""Public Hopper kernels for the blockwise FP8 grouped GEMM, run on our engine's operands
(scripts/bench_gemm.py --fp8-baselines times them next to ours):

- CUTLASS's sm90 grouped GEMM with blockwise scaling (the ptr-array FP8 blockwise mainloop),
  built from nvidia-cutlass's headers by benchmarks/probes/cutlass_fp8_grouped/ into
  .carry/cutlass_fp8_grouped/ (or $MOK_CUTLASS_FP8_GROUPED);
- DeepGEMM's m-grouped contiguous FP8 GEMM (m_grouped_fp8_gemm_nt_contiguous), built from
  source by benchmarks/probes/deep_gemm_build/ into .carry/deep_gemm_site/ (or
  $MOK_DEEP_GEMM_SITE), or any importable deep_gemm.

Our operands (ops.fp8_quantize_rows, ops.fp8_quantize_weight_blocks): E4M3 codes, one E8M0
scale code per 1 x 128 of each row, stored transposed [K / 128, rows padded to 16], and one
per 128 x 128 weight block [E, N / 128, K / 128]; experts' rows contiguous, offsets [E + 1].
The *_operands functions turn these into the layouts each kernel reads (fp32 scale values,
DeepGEMM's rows padded per expert to 128). They run once, outside every timed region; the
launches returned by *_launch run only the kernel.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from mok_megatron.recipes.fp8_blockwise import e8m0_values

ROOT = Path(__file__).resolve().parent.parent
CUTLASS_BUILD = Path(os.environ.get("MOK_CUTLASS_FP8_GROUPED",
                                    ROOT / ".carry" / "cutlass_fp8_grouped"))
DEEP_GEMM_SITE = Path(os.environ.get("MOK_DEEP_GEMM_SITE", ROOT / ".carry" / "deep_gemm_site"))
DEEPGEMM_ALIGNMENT = 128  # rows per expert segment in DeepGEMM's contiguous layout (sm90)


# ---------------------------------------------------------------------- operand conversion

def row_experts(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (expert of each row, the row's index inside its expert) for rows offsets[0]..[-1]
    (offsets: int prefix sums [E + 1] from 0)."""
    off = offsets.long()
    counts = off[1:] - off[:-1]
    expert = torch.repeat_interleave(torch.arange(len(counts), device=off.device), counts)
    local = torch.arange(int(off[-1]), device=off.device) - off[expert]
    return expert, local


def cutlass_operands(a_scale_codes: torch.Tensor, w_scale_codes: torch.Tensor,
                     offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our scale codes as the fp32 scales CUTLASS's grouped blockwise mainloop reads
    (grouped_gemm.cuh): A's per expert M-major [K / 128, m_e], expert e's block at
    K / 128 * offsets[e] of one flat tensor; B's N-major [E, K / 128, N / 128]."""
    k_blocks = a_scale_codes.shape[0]
    rows = int(offsets[-1])
    expert, local = row_experts(offsets)
    off = offsets.long()
    m = (off[1:] - off[:-1])[expert]
    # Row r of expert e, block j: at K/128 * offsets[e] + j * m_e + (r - offsets[e]).
    dest = (k_blocks * off[expert] + local)[None, :] + \
        torch.arange(k_blocks, device=off.device)[:, None] * m[None, :]
    a_scales = torch.empty(k_blocks * rows, dtype=torch.float32, device=a_scale_codes.device)
    a_scales[dest.flatten()] = e8m0_values(a_scale_codes[:, :rows]).flatten()
    return a_scales, e8m0_values(w_scale_codes).transpose(1, 2).contiguous()


@dataclass
class DeepGemmOperands:
    a: torch.Tensor              # E4M3 [padded rows, K], zero rows between experts
    a_scales: torch.Tensor       # fp32 [padded rows, K / 128], M-major, TMA-aligned stride
    w_scales: torch.Tensor       # fp32 [E, N / 128, K / 128]
    grouped_layout: torch.Tensor  # int32 [padded rows]: each row's expert, -1 on padding
    rows: torch.Tensor           # int64 [rows]: where each of our rows lies in the padded ones


def padded_rows(offsets: torch.Tensor, alignment: int = DEEPGEMM_ALIGNMENT):
    """-> (each row's index in a layout whose expert segments start at multiples of
    `alignment`, that layout's row count, each row's expert)."""
    off = offsets.long()
    counts = off[1:] - off[:-1]
    padded = (counts + alignment - 1) // alignment * alignment
    starts = torch.cumsum(padded, 0) - padded
    expert, local = row_experts(offsets)
    return starts[expert] + local, int(padded.sum()), expert


def deepgemm_operands(a_codes: torch.Tensor, a_scale_codes: torch.Tensor,
                      w_scale_codes: torch.Tensor, offsets: torch.Tensor,
                      alignment: int = DEEPGEMM_ALIGNMENT) -> DeepGemmOperands:
    """Our operands in DeepGEMM's sm90 contiguous layout: each expert's rows start at a
    multiple of `alignment` (padding rows hold zero codes, scale 1, expert -1), fp32 scales,
    the activation's M-major with its column stride padded to 16 bytes (DeepGEMM's
    get_mn_major_tma_aligned_tensor layout, so the call does not transform them)."""
    rows, k_blocks = int(offsets[-1]), a_scale_codes.shape[0]
    index, total, expert = padded_rows(offsets, alignment)
    device = a_codes.device
    a = torch.zeros(total, a_codes.shape[1], dtype=torch.uint8, device=device)
    a[index] = a_codes[:rows].view(torch.uint8)
    aligned = -(-total // 4) * 4
    a_scales = torch.ones(k_blocks, aligned, dtype=torch.float32, device=device)
    a_scales[:, index] = e8m0_values(a_scale_codes[:, :rows])
    layout = torch.full((total,), -1, dtype=torch.int32, device=device)
    layout[index] = expert.to(torch.int32)
    return DeepGemmOperands(a.view(torch.float8_e4m3fn), a_scales.t()[:total],
                            e8m0_values(w_scale_codes).contiguous(), layout, index)


# ----------------------------------------------------------------------------- the kernels

def load_cutlass():
    """The compiled CUTLASS baseline module, or why it is not importable (a string)."""
    if not CUTLASS_BUILD.is_dir():
        return (f"not built: no {CUTLASS_BUILD} (benchmarks/probes/cutlass_fp8_grouped/"
                "build.sh)")
    if str(CUTLASS_BUILD) not in sys.path:
        sys.path.insert(0, str(CUTLASS_BUILD))
    try:
        import cutlass_fp8_grouped
    except ImportError as e:
        return f"ImportError: {e}"
    return cutlass_fp8_grouped


def load_deep_gemm():
    """deep_gemm, or why it is not importable (a string). It compiles its kernels at run time
    with $CUDA_HOME/bin/nvcc (CUDA_HOME is set to the toolkit found where unset) and links
    NVRTC (libnvrtc.so.13 is loaded from pip's nvidia wheel where the loader would not find
    it)."""
    if DEEP_GEMM_SITE.is_dir() and str(DEEP_GEMM_SITE) not in sys.path:
        sys.path.insert(0, str(DEEP_GEMM_SITE))
    if not os.environ.get("CUDA_HOME"):
        toolkit = cuda_toolkit()
        if toolkit is None:
            return "no CUDA toolkit (nvcc) found for its run-time compilation; set CUDA_HOME"
        os.environ["CUDA_HOME"] = toolkit
    _preload_nvrtc()
    try:
        import deep_gemm
    except (ImportError, AssertionError, RuntimeError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    if not hasattr(deep_gemm, "m_grouped_fp8_gemm_nt_contiguous"):
        return f"deep_gemm {getattr(deep_gemm, '__version__', '?')} lacks m_grouped_fp8_gemm_nt_contiguous"
    return deep_gemm


def cuda_toolkit() -> Optional[str]:
    """The toolkit folder of the nvcc on PATH (through a wrapper script such as
    /usr/local/bin/nvcc: the first /usr/local/cuda* with bin/nvcc and bin/cuobjdump)."""
    import glob
    import shutil

    nvcc = shutil.which("nvcc")
    candidates = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))] if nvcc else []
    candidates += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    for home in candidates:
        if all(os.path.exists(os.path.join(home, "bin", tool)) for tool in ("nvcc", "cuobjdump")):
            return home
    return None


def _preload_nvrtc() -> None:
    import ctypes

    try:
        ctypes.CDLL("libnvrtc.so.13", mode=ctypes.RTLD_GLOBAL)
        return
    except OSError:
        pass
    for root in sys.path:
        lib = Path(root) / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
        if lib.exists():
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            return


# CUTLASS's tile scheduler raster orders tried beside each compiled variant.
CUTLASS_RASTERS = {"heuristic": 0, "along_m": 1, "along_n": 2}


def cutlass_launch(module, a_codes, a_scale_codes, w_codes, w_scale_codes, offsets, out,
                   time_fn: Callable[[Callable], float]):
    """-> (the fastest launch of the compiled variants x raster orders by `time_fn` (seconds of
    one call), its name, every candidate's seconds or why CUTLASS refused it). All write
    `out` [rows, N]."""
    a_scales, w_scales = cutlass_operands(a_scale_codes, w_scale_codes, offsets)
    rows = int(offsets[-1])
    a = a_codes[:rows].contiguous()
    w = w_codes.contiguous()
    tried, best = {}, None
    for variant in module.variants():
        for raster_name, raster in CUTLASS_RASTERS.items():
            name = f"{variant}/{raster_name}"
            try:
                launch = module.prepare(variant, a, a_scales, w, w_scales, offsets, out[:rows],
                                        raster, 1)
                launch()
                torch.cuda.synchronize()
            except RuntimeError as e:
                if "cutlass_fp8_grouped:" not in str(e):
                    raise  # a CUDA error: the context is gone, not a refused configuration
                tried[name] = f"refused: {str(e)[:160]}"
                continue
            tried[name] = seconds = time_fn(launch)
            if best is None or seconds < best[0]:
                best = (seconds, name, launch)
    if best is None:
        raise RuntimeError(f"no CUTLASS variant ran: {tried}")
    return best[2], best[1], tried


def deepgemm_launch(module, a_codes, a_scale_codes, w_codes, w_scale_codes, offsets,
                    n: int) -> tuple[Callable, Callable[[], torch.Tensor]]:
    """-> (a launch of m_grouped_fp8_gemm_nt_contiguous on the padded layout, a function
    returning its output's rows in our order)."""
    ops_ = deepgemm_operands(a_codes, a_scale_codes, w_scale_codes, offsets)
    d = torch.empty(ops_.a.shape[0], n, dtype=torch.bfloat16, device=a_codes.device)
    w = w_codes.contiguous()

    def launch():
        module.m_grouped_fp8_gemm_nt_contiguous((ops_.a, ops_.a_scales), (w, ops_.w_scales), d,
                                                ops_.grouped_layout)

    return launch, lambda: d[ops_.rows]
