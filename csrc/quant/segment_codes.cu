// Rows kept for backward as FP8 (saved backward inputs under an FP8 recipe,
// mok_megatron/cuda/operands.py SegmentCodes): forward's pulled token rows are read in backward only
// by dW1, along each expert's rows (Q_n), so forward keeps them as exactly that - E4M3 codes
// and one E8M0 scale code per block of `kBlock` rows of a column, blocks from each segment's
// (expert's) first row, the last one short - and backward dequantizes them for wgrad: bit for
// bit what mx_round_segments writes (the same scale rule, code and value: quant/mx_format.cuh),
// about half the bytes kept between forward and backward.
//   codes   [rows, cols] one byte each, a row's codes where its bf16 values were;
//   scales  [>= row blocks, cols], block b (numbered segment by segment, number_row_blocks) in
//           row b; 255 where the block's column holds a NaN or an Inf (its values become NaN).
// A thread owns one 16-byte vector of bf16 columns (8 columns) and one block of rows, as
// mx_round_segments_kernel does; rows outside every segment are not written.
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <algorithm>

#include "common/error.cuh"
#include "common/vec.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"
#include "quant/column_block.cuh"
#include "quant/mx_format.cuh"

namespace mok {
namespace {

// Where the row blocks of every segment start (shared memory), and block b's place.
struct SegmentBlock {
  int64_t r0;  // first row
  int len;     // rows (kBlock, or fewer for a segment's last block)
};

template <int kBlock>
__device__ __forceinline__ SegmentBlock segment_block(const int64_t* first_block,
                                                      const int32_t* offsets, int segments,
                                                      int64_t b) {
  const int s = segment_of_block(first_block, segments, b);
  const int64_t r0 = offsets[s] + (b - first_block[s]) * kBlock;
  return {r0, static_cast<int>(min(static_cast<int64_t>(kBlock), offsets[s + 1] - r0))};
}

template <int kBlock>
__global__ void mx_quantize_segments_kernel(const __nv_bfloat16* __restrict__ x, int cols,
                                            const int32_t* __restrict__ offsets, int segments,
                                            uint8_t* __restrict__ codes,
                                            uint8_t* __restrict__ scales) {
  __shared__ int64_t first_block[kGemmMaxExperts + 1];
  if (threadIdx.x == 0) number_row_blocks<kBlock>(offsets, segments, 0, first_block);
  __syncthreads();
  const int vecs = cols / 8;
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vecs) return;
  const int4* in = reinterpret_cast<const int4*>(x);
  for (int64_t b = blockIdx.y; b < first_block[segments]; b += gridDim.y) {
    const SegmentBlock sb = segment_block<kBlock>(first_block, offsets, segments, b);
    const ColumnBlock block(in + sb.r0 * vecs + v, vecs, sb.len);
    uint8_t s[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[j] = block.finite[j] ? static_cast<uint8_t>(block.e[j] + kE8m0Bias) : kE8m0Nan;
    }
    *reinterpret_cast<uint2*>(scales + b * cols + 8 * v) = *reinterpret_cast<const uint2*>(s);
    for (int i = 0; i < sb.len; ++i) {
      Bf16x8 row;
      row.raw = in[(sb.r0 + i) * vecs + v];
      uint8_t q[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) q[j] = mx_code(__bfloat162float(row.v[j]), block.e[j]);
      *reinterpret_cast<uint2*>(codes + (sb.r0 + i) * cols + 8 * v) =
          *reinterpret_cast<const uint2*>(q);
    }
  }
}

template <int kBlock>
__global__ void mx_dequantize_segments_kernel(const uint8_t* __restrict__ codes,
                                              const uint8_t* __restrict__ scales, int cols,
                                              const int32_t* __restrict__ offsets, int segments,
                                              __nv_bfloat16* __restrict__ out) {
  __shared__ int64_t first_block[kGemmMaxExperts + 1];
  if (threadIdx.x == 0) number_row_blocks<kBlock>(offsets, segments, 0, first_block);
  __syncthreads();
  const int vecs = cols / 8;
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vecs) return;
  int4* o = reinterpret_cast<int4*>(out);
  for (int64_t b = blockIdx.y; b < first_block[segments]; b += gridDim.y) {
    const SegmentBlock sb = segment_block<kBlock>(first_block, offsets, segments, b);
    const uint2 s = *reinterpret_cast<const uint2*>(scales + b * cols + 8 * v);
    const uint8_t* sc = reinterpret_cast<const uint8_t*>(&s);
    float factor[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) factor[j] = e8m0_factor(sc[j]);
    for (int i = 0; i < sb.len; ++i) {
      const uint2 q = *reinterpret_cast<const uint2*>(codes + (sb.r0 + i) * cols + 8 * v);
      // Two codes per dequantize_pair, each pair's columns at their own blocks' factors.
      const uint32_t w[2] = {q.x, q.y};
      uint32_t r[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t pair = w[k / 2] >> (16 * (k % 2));
        const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), __NV_E4M3)));
        r[k] = pack_bf16x2(__fmul_rn(f.x, factor[2 * k]), __fmul_rn(f.y, factor[2 * k + 1]));
      }
      o[(sb.r0 + i) * vecs + v] = make_int4(r[0], r[1], r[2], r[3]);
    }
  }
}

// Checks shared by both directions; returns the number of segments.
int64_t check_segment_codes(const at::Tensor& codes, const at::Tensor& scales,
                            const at::Tensor& offsets, int64_t rows, int64_t cols, int64_t block,
                            const c10::Device& device, const char* what) {
  MOK_HOST_CHECK(block == kMxBlock || block == kFp8ScaleBlock, what, ": block must be ",
                 kMxBlock, " (MXFP8) or ", kFp8ScaleBlock, " (blockwise FP8), got ", block);
  MOK_HOST_CHECK(offsets.scalar_type() == at::kInt && offsets.dim() == 1 &&
                     offsets.numel() >= 2 && offsets.is_contiguous() && offsets.device() == device,
                 what, ": offsets must be int32 [segments + 1] on the rows' device");
  const int64_t segments = offsets.numel() - 1;
  MOK_HOST_CHECK(segments <= kGemmMaxExperts, what, ": ", segments, " segments exceed ",
                 kGemmMaxExperts);
  MOK_HOST_CHECK(cols % 8 == 0, what, ": columns must be a multiple of 8, got ", cols);
  MOK_HOST_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2 &&
                     codes.size(0) == rows && codes.size(1) == cols && codes.device() == device,
                 what, ": codes must be contiguous uint8 [", rows, ", ", cols, "] on the rows' "
                 "device");
  // At most one block per `block` rows plus a short one per segment.
  const int64_t blocks = rows / block + segments;
  MOK_HOST_CHECK(scales.scalar_type() == at::kByte && scales.is_contiguous() &&
                     scales.dim() == 2 && scales.size(0) >= blocks && scales.size(1) == cols &&
                     scales.device() == device,
                 what, ": scales must be contiguous uint8 [>= ", blocks, ", ", cols,
                 "] on the rows' device");
  return segments;
}

// The kernel for `block` rows per scale (MXFP8's or the blockwise recipe's instance) over a
// thread per 16-byte vector of columns and as many row blocks per CTA row as fill the GPU.
template <class Kernel, class... Args>
void launch_for_block(int64_t block, Kernel mx, Kernel blockwise, int64_t rows, int64_t cols,
                      int64_t segments, Args... args) {
  const int64_t worst = rows / block + segments;
  const int col_blocks = static_cast<int>((cols / 8 + kMxRoundThreads - 1) / kMxRoundThreads);
  const int64_t wanted = static_cast<int64_t>(
      at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * kBlocksPerSm * 4;
  const dim3 grid(col_blocks, static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>({worst, (wanted + col_blocks - 1) / col_blocks, 65535}))));
  (block == kMxBlock ? mx : blockwise)<<<grid, kMxRoundThreads, 0,
                                         at::cuda::getCurrentCUDAStream()>>>(args...);
  MOK_LAUNCH_CHECK();
}

}  // namespace

void mx_quantize_segments(const at::Tensor& x, const at::Tensor& offsets, int64_t block,
                          at::Tensor& codes, at::Tensor& scales) {
  MOK_HOST_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 &&
                     x.is_contiguous(),
                 "mx_quantize_segments: x must be a contiguous 2-D bf16 CUDA tensor");
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t segments = check_segment_codes(codes, scales, offsets, rows, cols, block,
                                               x.device(), "mx_quantize_segments");
  if (x.numel() == 0) return;
  launch_for_block(block, mx_quantize_segments_kernel<kMxBlock>,
                   mx_quantize_segments_kernel<kFp8ScaleBlock>, rows, cols, segments,
                   reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), static_cast<int>(cols),
                   offsets.data_ptr<int32_t>(), static_cast<int>(segments),
                   codes.data_ptr<uint8_t>(), scales.data_ptr<uint8_t>());
}

void mx_dequantize_segments(const at::Tensor& codes, const at::Tensor& scales,
                            const at::Tensor& offsets, int64_t block, at::Tensor& out) {
  MOK_HOST_CHECK(out.is_cuda() && out.dim() == 2 && out.scalar_type() == at::kBFloat16 &&
                     out.is_contiguous(),
                 "mx_dequantize_segments: out must be a contiguous 2-D bf16 CUDA tensor");
  const int64_t rows = out.size(0), cols = out.size(1);
  const int64_t segments = check_segment_codes(codes, scales, offsets, rows, cols, block,
                                               out.device(), "mx_dequantize_segments");
  if (out.numel() == 0) return;
  launch_for_block(block, mx_dequantize_segments_kernel<kMxBlock>,
                   mx_dequantize_segments_kernel<kFp8ScaleBlock>, rows, cols, segments,
                   codes.data_ptr<uint8_t>(), scales.data_ptr<uint8_t>(), static_cast<int>(cols),
                   offsets.data_ptr<int32_t>(), static_cast<int>(segments),
                   reinterpret_cast<__nv_bfloat16*>(out.data_ptr()));
}

}  // namespace mok
