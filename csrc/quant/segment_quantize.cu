// Wgrad's operands under the blockwise recipe (gemm/fp8_wgrad.cu), bit for bit as
// fp8_blockwise.quantize_rows(x_e, dim=0) per expert e: x [rows, cols] (the schedule's rows of
// dY, act, dh or x) cut into experts' segments (offsets), each quantized in blocks of 128
// rows from its first row, written transposed - codes [cols, K_pad] with expert e's blocks at
// block_offsets[e] .. block_offsets[e + 1] (a short last block's missing rows as zero codes)
// and one scale per (block, column): E8M0 codes [K_pad / 128, >= cols] for wgrad's A operand,
// bf16 column scales in the FP8 engine's fragment order for its B operand. FP8 MMAs read K-major
// operands only; K here is the rows, so the codes are the transpose. A thread owns 8 columns
// and one block: a pass for the amax (quant/column_block.cuh), then 16 rows at a time
// rounded and stored as 16 bytes per column. A NaN or Inf makes its column's block NaN.
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "common/vec.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"
#include "quant/column_block.cuh"
#include "quant/mx_format.cuh"

namespace mok {
namespace {

constexpr int kSegmentBlock = kFp8ScaleBlock;
static_assert(kSegmentBlock % 16 == 0, "whole 16-byte code vectors per block");

// Where block b's scale of column c goes: E8M0 codes [blocks, scale_row] (the A operand's
// row scales), or, for the B operand, the FP8 engine's bf16 column scales in fragment order
// (gemm/sm90/fp8_mainloop.cuh, ColumnScaleLayout, one half: [blocks, scale_row] with column c
// of each group of 128 at ((c % 8) / 2) * 32 + 2 ((c % 128) / 8) + c % 2).
template <bool kColumnScales>
__device__ __forceinline__ void store_scale(uint8_t* scales, int64_t scale_row, int64_t b,
                                            int c, const ColumnBlock& block, int j) {
  const uint8_t code =
      block.finite[j] ? static_cast<uint8_t>(block.e[j] + kE8m0Bias) : kE8m0Nan;
  if constexpr (kColumnScales) {
    const int in_group = c % kFp8BlockN;
    const int at = c - in_group + ((c % 8) / 2) * (kFp8BlockN / 4) + 2 * (in_group / 8) + c % 2;
    // A power of two 2^-127 .. 2^127 or NaN: exact in bf16 (fp32's exponent range).
    reinterpret_cast<__nv_bfloat16*>(scales)[b * scale_row + at] =
        __float2bfloat16_rn(e8m0_factor(code));
  } else {
    scales[b * scale_row + c] = code;
  }
}

template <bool kColumnScales>
__global__ void quantize_segments_t_kernel(const __nv_bfloat16* __restrict__ x, int cols,
                                           const int32_t* __restrict__ offsets,
                                           const int32_t* __restrict__ block_offsets,
                                           int segments, uint8_t* __restrict__ codes,
                                           int64_t code_row, uint8_t* __restrict__ scales,
                                           int64_t scale_row) {
  __shared__ int32_t first_block[kGemmMaxExperts + 1];
  for (int s = threadIdx.x; s <= segments; s += blockDim.x) first_block[s] = block_offsets[s];
  __syncthreads();
  const int vecs = cols / 8;
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vecs) return;
  const int4* in = reinterpret_cast<const int4*>(x);
  for (int64_t b = blockIdx.y; b < first_block[segments]; b += gridDim.y) {
    const int lo = segment_of_block(first_block, segments, b);
    const int64_t r0 = offsets[lo] + (b - first_block[lo]) * kSegmentBlock;
    const int len = static_cast<int>(min(static_cast<int64_t>(kSegmentBlock), offsets[lo + 1] - r0));
    const int4* src = in + r0 * vecs + v;
    const ColumnBlock block(src, vecs, len);
#pragma unroll 1
    for (int i0 = 0; i0 < kSegmentBlock; i0 += 16) {  // rows past the segment: zero codes
      uint32_t q[8][4];
      block.codes16(src, vecs, i0, len, q);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        *reinterpret_cast<int4*>(codes + (8 * v + j) * code_row + b * kSegmentBlock + i0) =
            make_int4(q[j][0], q[j][1], q[j][2], q[j][3]);
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) store_scale<kColumnScales>(scales, scale_row, b, 8 * v + j, block, j);
  }
}

}  // namespace

void fp8_quantize_segments_t(const at::Tensor& x, const at::Tensor& offsets,
                             const at::Tensor& block_offsets, at::Tensor& codes,
                             at::Tensor& scales) {
  const char* what = "fp8_quantize_segments_t";
  MOK_HOST_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 &&
                     x.is_contiguous() && x.size(1) % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
                 what, ": x must be contiguous 2-D bf16 on the GPU with a multiple of 8 "
                 "columns, got ", x.sizes());
  for (const at::Tensor* t : {&offsets, &block_offsets}) {
    MOK_HOST_CHECK(t->device() == x.device() && t->scalar_type() == at::kInt && t->dim() == 1 &&
                       t->is_contiguous() && t->numel() == offsets.numel() &&
                       t->numel() >= 2 && t->numel() - 1 <= kGemmMaxExperts,
                   what, ": offsets and block_offsets must be int32 [E + 1] on x's device, "
                   "1 <= E <= ", kGemmMaxExperts);
  }
  const int64_t cols = x.size(1);
  MOK_HOST_CHECK(codes.device() == x.device() && codes.element_size() == 1 && codes.dim() == 2 &&
                     codes.size(0) == cols && codes.size(1) % kSegmentBlock == 0 &&
                     codes.stride(1) == 1 && codes.stride(0) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(codes.data_ptr()) % 16 == 0,
                 what, ": codes must be one-byte [", cols, ", K_pad] with K_pad whole blocks of ",
                 kSegmentBlock, " and rows 16-byte aligned, got ", codes.sizes());
  const int64_t blocks = codes.size(1) / kSegmentBlock;
  const bool columns = scales.scalar_type() == at::kBFloat16;
  const int64_t padded = (cols + kFp8BlockN - 1) / kFp8BlockN * kFp8BlockN;
  if (columns) {
    MOK_HOST_CHECK(scales.device() == x.device() && scales.is_contiguous() &&
                       scales.dim() == 4 && scales.size(0) == 1 && scales.size(1) == blocks &&
                       scales.size(2) == 1 && scales.size(3) == padded,
                   what, ": column scales must be contiguous bf16 [1, ", blocks, ", 1, ", padded,
                   "], got ", scales.sizes());
  } else {
    MOK_HOST_CHECK(scales.device() == x.device() && scales.scalar_type() == at::kByte &&
                       scales.dim() == 2 && scales.size(0) == blocks &&
                       scales.size(1) >= cols && scales.stride(1) == 1,
                   what, ": scales must be uint8 E8M0 [", blocks, ", >= ", cols,
                   "] or bf16 column scales, got ", scales.sizes());
  }
  // The blocks the segments need are at most ceil(rows / 128) + E; block_offsets is checked
  // against the codes' K_pad only on the device, so K_pad must hold the worst case.
  const int64_t segments = offsets.numel() - 1;
  MOK_HOST_CHECK(blocks >= (x.size(0) + kSegmentBlock - 1) / kSegmentBlock + segments,
                 what, ": K_pad = ", codes.size(1), " cannot hold the worst case of ",
                 x.size(0), " rows in ", segments, " segments");
  if (x.numel() == 0) return;
  const int col_blocks = static_cast<int>((cols / 8 + kMxRoundThreads - 1) / kMxRoundThreads);
  const int64_t wanted = static_cast<int64_t>(
      at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * kBlocksPerSm * 4;
  const dim3 grid(col_blocks, static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>({blocks, (wanted + col_blocks - 1) / col_blocks, 65535}))));
  auto kernel = columns ? quantize_segments_t_kernel<true> : quantize_segments_t_kernel<false>;
  kernel<<<grid, kMxRoundThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), static_cast<int>(cols),
      offsets.data_ptr<int32_t>(), block_offsets.data_ptr<int32_t>(),
      static_cast<int>(segments), reinterpret_cast<uint8_t*>(codes.data_ptr()),
      codes.stride(0), reinterpret_cast<uint8_t*>(scales.data_ptr()),
      columns ? padded : scales.stride(0));
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
