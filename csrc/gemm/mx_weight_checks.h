// Host-side checks of an MXFP8 weight as the tile engine reads it (gemm/sm90/mx_weight_stage.cuh,
// mok_megatron/cuda/mxfp8_weights.py lays it out): E4M3 codes [E, N, K] in 16-byte aligned rows and
// experts, and E8M0 scale codes [E, ceil(K / kMxBlock), halves, N / halves padded to 16]; and
// of a blockwise FP8 weight as the FP8 engine reads it (gemm/sm90/fp8_mainloop.cuh,
// mok_megatron/cuda/fp8_block_weights.py): the same codes, one E8M0 code per 128 x 128 block
// [E, ceil(N / 128), ceil(K / 128)].
#pragma once

#include <torch/extension.h>

#include <cstdint>

#include "common/error.cuh"
#include "config/kernel_config.cuh"

namespace mok {

// `who` names the caller in every message; `halves`: 2 for a gated FC1's gate | up rows.
inline void check_mx_weight(const char* who, const at::Tensor& w, const at::Tensor& scales,
                            int halves) {
  MOK_HOST_CHECK(w.scalar_type() == at::kFloat8_e4m3fn && w.dim() == 3,
                 who, ": MXFP8 weight codes must be float8_e4m3fn [E, N, K]");
  MOK_HOST_CHECK(w.stride(0) % 16 == 0 && w.stride(1) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0,
                 who, ": MXFP8 weight codes need 16-byte aligned rows and experts (pad K; "
                 "mok_megatron/cuda/mxfp8_weights.py does)");
  MOK_HOST_CHECK(w.size(1) % halves == 0, who, ": a gated weight needs an even N");
  const int64_t blocks = (w.size(2) + kMxBlock - 1) / kMxBlock;
  const int64_t half_rows = w.size(1) / halves;
  MOK_HOST_CHECK(scales.is_cuda() && scales.device() == w.device() &&
                     scales.scalar_type() == at::kByte && scales.is_contiguous() &&
                     scales.dim() == 4 && scales.size(0) == w.size(0) &&
                     scales.size(1) == blocks && scales.size(2) == halves &&
                     scales.size(3) >= half_rows && scales.size(3) % 16 == 0,
                 who, ": weight scales must be contiguous uint8 [", w.size(0), ", ", blocks,
                 ", ", halves, ", >= ", half_rows, " padded to 16] (E8M0 per ", kMxBlock,
                 " of K), got ", scales.sizes());
}

inline void check_fp8_block_weight(const char* who, const at::Tensor& w,
                                   const at::Tensor& scales) {
  MOK_HOST_CHECK(w.scalar_type() == at::kFloat8_e4m3fn && w.dim() == 3 && w.stride(2) == 1,
                 who, ": blockwise FP8 weight codes must be float8_e4m3fn [E, N, K], K innermost");
  MOK_HOST_CHECK(w.stride(0) % 16 == 0 && w.stride(1) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0,
                 who, ": blockwise FP8 weight codes need 16-byte aligned rows and experts (pad "
                 "K; mok_megatron/cuda/fp8_block_weights.py does)");
  const int64_t row_blocks = (w.size(1) + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  const int64_t k_blocks = (w.size(2) + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  MOK_HOST_CHECK(scales.is_cuda() && scales.device() == w.device() &&
                     scales.scalar_type() == at::kByte && scales.is_contiguous() &&
                     scales.dim() == 3 && scales.size(0) == w.size(0) &&
                     scales.size(1) == row_blocks && scales.size(2) == k_blocks,
                 who, ": weight scales must be contiguous uint8 [", w.size(0), ", ", row_blocks,
                 ", ", k_blocks, "] (E8M0 per ", kFp8ScaleBlock, " x ", kFp8ScaleBlock,
                 " block), got ", scales.sizes());
}

}  // namespace mok
