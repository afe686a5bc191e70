// MXFP8 rounding of GEMM operands, bit for bit as mok_megatron/mxfp8.py (the reference):
// blocks of kMxBlock consecutive elements along the dimension a GEMM reduces over share one
// power-of-two scale 2^e, e from the block's amax (mxfp8.scale_exponent), and every element
// becomes the E4M3 value nearest (ties to even, saturating at +-448) to v / 2^e. The kernels
// here write the rounded values dequantized back to bf16 (v' = E4M3 * 2^e), so the BF16
// grouped GEMMs multiply exactly MXFP8's operands with fp32 accumulation. E4M3 * 2^e has at
// most 4 significant bits, so bf16 holds it exactly for |v'| >= 2^-126 (below that bf16's
// subnormals round it; blocks that small never reach a GEMM in training).
//
// A block with a NaN or an Inf becomes NaN throughout (its E8M0 code is 255).
//   along columns   x [rows, cols], blocks along each row (x, act, dY, dh and the weights in
//                   their stored orientation): one warp per block, lanes over its elements;
//   along segments  x [rows, cols] cut into segments of rows (an expert's rows, given by the
//                   schedule's offsets, or every `segment_rows` rows: a stacked weight in its
//                   other orientation), blocks along the rows from each segment's first row,
//                   the last one short: one thread per column and block, 32 rows in registers.
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"

namespace mok {
namespace {

constexpr float kRcpE4m3Max = 1.0f / 448.0f;  // fp32(1/448), as mxfp8._RCP_E4M3_MAX

// mxfp8.scale_exponent: the exponent of amax * fp32(1/448) rounded up unless it is a power
// of two, clamped to E8M0's [-127, 127].
__device__ __forceinline__ int mx_scale_exponent(float amax) {
  const uint32_t bits = __float_as_uint(__fmul_rn(amax, kRcpE4m3Max));
  const int biased = static_cast<int>((bits >> 23) & 0xFF);
  const int e = biased > 0 ? biased - 127 + ((bits & 0x7FFFFF) != 0) : -127;
  return max(-127, min(127, e));
}

// 2^k exactly for k in [-127, 127] (2^-127 is an fp32 subnormal).
__device__ __forceinline__ float exact_exp2(int k) {
  return k >= -126 ? __uint_as_float(static_cast<uint32_t>(k + 127) << 23)
                   : __uint_as_float(0x400000u);
}

// v at scale 2^e rounded to E4M3 and back. SATFINITE gives what the reference's clamp to
// +-448 before its cast gives.
__device__ __forceinline__ float mx_round(float v, int e) {
  const float scaled = __fmul_rn(v, exact_exp2(-e));
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(scaled, __NV_SATFINITE, __NV_E4M3);
  const float back = __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
  return __fmul_rn(back, exact_exp2(e));
}

__device__ __forceinline__ __nv_bfloat16 bf16_nan() {
  return __ushort_as_bfloat16(static_cast<unsigned short>(0x7FC0));
}

template <int kBlock>
__global__ void mx_round_columns_kernel(const __nv_bfloat16* __restrict__ x, int64_t rows,
                                        const int32_t* __restrict__ num_rows, int cols,
                                        __nv_bfloat16* __restrict__ out) {
  static_assert(kBlock % 32 == 0, "a warp covers a block in whole passes");
  constexpr int kPerLane = kBlock / 32;
  const int lane = threadIdx.x % 32;
  const int64_t n = num_rows != nullptr ? min(rows, static_cast<int64_t>(*num_rows)) : rows;
  const int per_row = (cols + kBlock - 1) / kBlock;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       b < n * per_row; b += warps) {
    const int64_t base = (b / per_row) * cols;
    const int c0 = static_cast<int>(b % per_row) * kBlock + lane;
    float v[kPerLane];
    float amax = 0.f;
    bool finite = true;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int c = c0 + 32 * j;
      v[j] = c < cols ? __bfloat162float(x[base + c]) : 0.f;
      const bool ok = isfinite(v[j]);
      finite &= ok;
      if (ok) amax = fmaxf(amax, fabsf(v[j]));
    }
    // |v| >= 0, so its bits order as the floats do.
    amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(amax)));
    finite = __all_sync(0xffffffffu, finite);
    const int e = mx_scale_exponent(amax);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int c = c0 + 32 * j;
      if (c < cols) out[base + c] = finite ? __float2bfloat16_rn(mx_round(v[j], e)) : bf16_nan();
    }
  }
}

// Segment e: rows [offsets[e], offsets[e+1]), or [e * segment_rows, (e+1) * segment_rows)
// when offsets is null. Row blocks are numbered segment by segment; a CTA keeps the first
// row block of every segment in shared memory and walks the blocks given to it.
template <int kBlock>
__global__ void mx_round_segments_kernel(const __nv_bfloat16* __restrict__ x, int cols,
                                         const int32_t* __restrict__ offsets, int segments,
                                         int64_t segment_rows,
                                         __nv_bfloat16* __restrict__ out) {
  __shared__ int64_t first_block[kGemmMaxExperts + 1];
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int s = 0; s < segments; ++s) {
      first_block[s] = sum;
      const int64_t len = offsets != nullptr ? offsets[s + 1] - offsets[s] : segment_rows;
      sum += (len + kBlock - 1) / kBlock;
    }
    first_block[segments] = sum;
  }
  __syncthreads();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t total = first_block[segments];
  for (int64_t b = blockIdx.y; b < total; b += gridDim.y) {
    // The segment holding row block b: the last s with first_block[s] <= b.
    int lo = 0, hi = segments - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (first_block[mid] <= b) lo = mid; else hi = mid - 1;
    }
    const int64_t seg_begin = offsets != nullptr ? offsets[lo] : lo * segment_rows;
    const int64_t seg_end = offsets != nullptr ? offsets[lo + 1] : (lo + 1) * segment_rows;
    const int64_t r0 = seg_begin + (b - first_block[lo]) * kBlock;
    const int len = static_cast<int>(min(static_cast<int64_t>(kBlock), seg_end - r0));
    if (c >= cols) continue;
    float v[kBlock];
    float amax = 0.f;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < kBlock; ++i) {
      v[i] = i < len ? __bfloat162float(x[(r0 + i) * cols + c]) : 0.f;
      const bool ok = isfinite(v[i]);
      finite &= ok;
      if (ok) amax = fmaxf(amax, fabsf(v[i]));
    }
    const int e = mx_scale_exponent(amax);
#pragma unroll
    for (int i = 0; i < kBlock; ++i) {
      if (i < len) {
        out[(r0 + i) * cols + c] = finite ? __float2bfloat16_rn(mx_round(v[i], e)) : bf16_nan();
      }
    }
  }
}

void check_operand(const at::Tensor& x, const at::Tensor& out, const char* what) {
  MOK_HOST_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 &&
                     x.is_contiguous(), what, ": x must be a contiguous 2-D bf16 CUDA tensor");
  MOK_HOST_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() &&
                     out.sizes() == x.sizes() && out.device() == x.device(),
                 what, ": out must be a contiguous bf16 tensor of x's shape on x's device");
}

}  // namespace

void mx_round_columns(const at::Tensor& x, const c10::optional<at::Tensor>& num_rows,
                      at::Tensor& out) {
  check_operand(x, out, "mx_round_columns");
  if (num_rows.has_value()) {
    MOK_HOST_CHECK(num_rows->scalar_type() == at::kInt && num_rows->numel() == 1 &&
                       num_rows->device() == x.device(),
                   "mx_round_columns: num_rows must be one int32 on x's device");
  }
  if (x.numel() == 0) return;
  const int threads = kMxRoundThreads;
  const int blocks = at::cuda::getCurrentDeviceProperties()->multiProcessorCount * kBlocksPerSm;
  mx_round_columns_kernel<kMxBlock><<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), x.size(0),
      num_rows.has_value() ? num_rows->data_ptr<int32_t>() : nullptr,
      static_cast<int>(x.size(1)), reinterpret_cast<__nv_bfloat16*>(out.data_ptr()));
  MOK_LAUNCH_CHECK();
}

void mx_round_segments(const at::Tensor& x, const c10::optional<at::Tensor>& offsets,
                       int64_t segment_rows, at::Tensor& out) {
  check_operand(x, out, "mx_round_segments");
  int64_t segments;
  if (offsets.has_value()) {
    MOK_HOST_CHECK(offsets->scalar_type() == at::kInt && offsets->dim() == 1 &&
                       offsets->numel() >= 2 && offsets->is_contiguous() &&
                       offsets->device() == x.device(),
                   "mx_round_segments: offsets must be int32 [segments + 1] on x's device");
    segments = offsets->numel() - 1;
  } else {
    MOK_HOST_CHECK(segment_rows > 0 && x.size(0) % segment_rows == 0,
                   "mx_round_segments: ", x.size(0), " rows are not whole segments of ",
                   segment_rows);
    segments = x.size(0) / segment_rows;
  }
  MOK_HOST_CHECK(segments <= kGemmMaxExperts, "mx_round_segments: ", segments,
                 " segments exceed ", kGemmMaxExperts);
  if (x.numel() == 0) return;
  // Row blocks: at most one per kMxBlock rows plus one short one per segment.
  const int64_t worst = x.size(0) / kMxBlock + segments;
  const int col_blocks = static_cast<int>((x.size(1) + kMxRoundThreads - 1) / kMxRoundThreads);
  const int64_t wanted = static_cast<int64_t>(
      at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * kBlocksPerSm * 4;
  const dim3 grid(col_blocks, static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>({worst, (wanted + col_blocks - 1) / col_blocks,
                                              65535}))));
  mx_round_segments_kernel<kMxBlock><<<grid, kMxRoundThreads, 0,
                                       at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), static_cast<int>(x.size(1)),
      offsets.has_value() ? offsets->data_ptr<int32_t>() : nullptr, static_cast<int>(segments),
      segment_rows, reinterpret_cast<__nv_bfloat16*>(out.data_ptr()));
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
