// MXFP8 rounding of GEMM operands, bit for bit as mok_megatron/recipes/mxfp8.py (the reference):
// blocks of kMxBlock consecutive elements along the dimension a GEMM reduces over share one
// power-of-two scale 2^e, e from the block's amax (mxfp8.scale_exponent), and every element
// becomes the E4M3 value nearest (ties to even, saturating at +-448) to v / 2^e. The kernels
// here write the rounded values dequantized back to bf16 (v' = E4M3 * 2^e), so the BF16
// grouped GEMMs multiply exactly MXFP8's operands with fp32 accumulation. E4M3 * 2^e has at
// most 4 significant bits, so bf16 holds it exactly for |v'| >= 2^-126 (below that bf16's
// subnormals round it; blocks that small never reach a GEMM in training).
//
// mx_quantize_columns writes the same blocks as E4M3 codes with one E8M0 scale code per block
// instead, and mx_quantize_rows_transposed a weight's blocks along its rows as the codes of its
// transpose: what the MXFP8 GEMMs read (1 byte per value, gemm/sm90/mx_weight_stage.cuh).
// quantize_wire_rows writes x's row blocks as a rank publishes them for dispatch under an FP8
// recipe: row t at t * row_bytes, its codes and then its scale codes (comm/rows.cu pulls them).
//
// A block with a NaN or an Inf becomes NaN throughout (its E8M0 code is 255).
//   along columns   x [rows, cols], blocks along each row (x, act, dY, dh and the weights in
//                   their stored orientation): a block is 4 lanes of 8 values;
//   along segments  x [rows, cols] cut into segments of rows (an expert's rows, given by the
//                   schedule's offsets, or every `segment_rows` rows: a stacked weight in its
//                   other orientation), blocks along the rows from each segment's first row,
//                   the last one short: a thread per 8 columns and block of rows.
// Every access is a 16-byte vector, so cols must be a multiple of 8 (H and F are).
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "common/vec.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"
#include "quant/column_block.cuh"
#include "quant/mx_format.cuh"
#include "quant/round_segments.h"

namespace mok {
namespace {

// v at scale 2^e rounded to E4M3 and back.
__device__ __forceinline__ float mx_round(float v, int e) { return mx_value(mx_code(v, e), e); }

__device__ __forceinline__ __nv_bfloat16 bf16_nan() {
  return __ushort_as_bfloat16(static_cast<unsigned short>(0x7FC0));
}

// Rounds the 8 values of v (one 16-byte vector of a block) at scale 2^e, or makes them NaN.
__device__ __forceinline__ int4 mx_round_vector(const Bf16x8& v, int e, bool finite) {
  Bf16x8 r;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    r.v[j] = finite ? __float2bfloat16_rn(mx_round(__bfloat162float(v.v[j]), e)) : bf16_nan();
  }
  return r.raw;
}

// amax of a vector's finite values, and whether all 8 are finite.
__device__ __forceinline__ float vector_amax(const Bf16x8& v, bool& finite) {
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float f = __bfloat162float(v.v[j]);
    const bool ok = isfinite(f);
    finite &= ok;
    if (ok) amax = fmaxf(amax, fabsf(f));
  }
  return amax;
}

// The MXFP8 GEMMs' scale layout (gemm/sm90/mx_weight_stage.cuh): the scale of weight row n
// of matrix e (rows of x are matrices of matrix_rows rows, each `halves` halves) for block b
// at [e][b][half][n % half_rows], half rows padded to `padded`.
struct ScaleLayout {
  uint8_t* scales;
  int64_t matrix_rows, half_rows, padded;
  int halves, blocks;

  // 32-bit divisions (rows < 2^31, checked at the launch): 64-bit ones cost ~60 instructions.
  __device__ int64_t at(int64_t row, int b) const {
    const int r = static_cast<int>(row), m = static_cast<int>(matrix_rows);
    const int e = r / m, n = r - e * m, h = static_cast<int>(half_rows);
    const int half = n / h;
    return ((static_cast<int64_t>(e) * blocks + b) * halves + half) * padded + (n - half * h);
  }
};

// The scales of wire rows (a rank's published x under an FP8 recipe, comm/rows.cu): each row
// is its codes followed, at the same row stride, by its blocks' scale codes in order.
struct RowScales {
  uint8_t* scales;  // row 0's first scale code
  int64_t row_stride;

  __device__ int64_t at(int64_t row, int b) const { return row * row_stride + b; }
};

// Where a columns pass writes a block: rounded and dequantized to bf16 in place of x's values
// (out), or as E4M3 codes (rows of code_stride bytes) and E8M0 scale codes at scales.at.
template <class Scales>
struct ColumnsOut {
  __nv_bfloat16* out;
  uint8_t* codes;
  int64_t code_stride;
  Scales scales;
};

// One 16-byte vector per lane: a block is kBlock / 8 consecutive lanes, a warp covers
// 32 * 8 / kBlock blocks per pass. Every lane of a warp runs every pass (lanes past the end
// hold zeros), so the shuffles that combine a block's lanes always see the whole warp.
template <int kBlock, bool kCodes, class Scales>
__global__ void mx_round_columns_kernel(const __nv_bfloat16* __restrict__ x, int64_t rows,
                                        const int32_t* __restrict__ num_rows, int cols,
                                        ColumnsOut<Scales> dst) {
  constexpr int kLanes = kBlock / 8;  // lanes of one block
  static_assert(kBlock % 8 == 0 && 32 % kLanes == 0, "a block is whole vectors of one warp");
  const int lane = threadIdx.x % 32;
  const int64_t n = num_rows != nullptr ? min(rows, static_cast<int64_t>(*num_rows)) : rows;
  const int per_row = (cols + kBlock - 1) / kBlock;
  const int64_t total = n * per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       w * (32 / kLanes) < total; w += warps) {
    const int64_t b = w * (32 / kLanes) + lane / kLanes;
    // Row and block within it by 32-bit division (the launch checks that the block count fits
    // int32): a 64-bit division per vector was most of the pass's instructions.
    const int row32 = static_cast<int>(b) / per_row;
    const int64_t row = row32;
    const int blk = static_cast<int>(b) - row32 * per_row;
    const int c = blk * kBlock + (lane % kLanes) * 8;
    const bool here = b < total && c < cols;  // cols is a multiple of 8: whole vectors
    const int64_t at = (row * cols + c) / 8;
    Bf16x8 v;
    v.raw = here ? reinterpret_cast<const int4*>(x)[at] : make_int4(0, 0, 0, 0);
    bool finite = true;
    float amax = vector_amax(v, finite);
    // |v| >= 0: its bits order as the floats do, so the max of the bits is the max.
    uint32_t bits = __float_as_uint(amax);
    int ok = finite;
#pragma unroll
    for (int d = 1; d < kLanes; d *= 2) {
      bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, d));
      ok &= __shfl_xor_sync(0xffffffffu, ok, d);
    }
    if (!here) continue;
    const int e = mx_scale_exponent(__uint_as_float(bits));
    if constexpr (kCodes) {
      uint8_t q[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) q[j] = ok ? mx_code(__bfloat162float(v.v[j]), e) : kE4m3Nan;
      *reinterpret_cast<uint2*>(dst.codes + row * dst.code_stride + c) =
          *reinterpret_cast<const uint2*>(q);
      if (lane % kLanes == 0) {
        dst.scales.scales[dst.scales.at(row, blk)] =
            ok ? static_cast<uint8_t>(e + kE8m0Bias) : kE8m0Nan;
      }
    } else {
      reinterpret_cast<int4*>(dst.out)[at] = mx_round_vector(v, e, ok);
    }
  }
}

// Segments as quant/column_block.cuh's segment_begin gives them; MXFP8's 32-row blocks (the
// blockwise recipe's 128-row ones run on the both-forms pass's units: quant/round_segments.h).
// Row blocks are numbered segment by segment; a CTA keeps the first row block of every segment
// in shared memory and walks the blocks given to it. A thread owns one 16-byte vector of
// columns: a first pass over the block's rows takes their amax, a second (from L2) rounds and
// stores them.
__global__ void mx_round_segments_kernel(const __nv_bfloat16* __restrict__ x, int cols,
                                         const int32_t* __restrict__ offsets, int segments,
                                         int64_t segment_rows,
                                         __nv_bfloat16* __restrict__ out) {
  constexpr int kBlock = kMxBlock;
  __shared__ int64_t first_block[kGemmMaxExperts + 1];
  if (threadIdx.x == 0) number_row_blocks<kBlock>(offsets, segments, segment_rows, first_block);
  __syncthreads();
  const int vecs = cols / 8;
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t total = first_block[segments];
  if (v >= vecs) return;
  const int4* in = reinterpret_cast<const int4*>(x);
  int4* o = reinterpret_cast<int4*>(out);
  for (int64_t b = blockIdx.y; b < total; b += gridDim.y) {
    const int lo = segment_of_block(first_block, segments, b);
    const int64_t seg_begin = segment_begin(offsets, segment_rows, lo);
    const int64_t seg_end = segment_begin(offsets, segment_rows, lo + 1);
    const int64_t r0 = seg_begin + (b - first_block[lo]) * kBlock;
    const int len = static_cast<int>(min(static_cast<int64_t>(kBlock), seg_end - r0));
    const ColumnBlock block(in + r0 * vecs + v, vecs, len);
    for (int i = 0; i < len; ++i) {
      Bf16x8 row, r;
      row.raw = in[(r0 + i) * vecs + v];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        r.v[j] = block.finite[j]
                     ? __float2bfloat16_rn(mx_round(__bfloat162float(row.v[j]), block.e[j]))
                     : bf16_nan();
      }
      o[(r0 + i) * vecs + v] = r.raw;
    }
  }
}

void check_operand(const at::Tensor& x, const at::Tensor& out, const char* what) {
  MOK_HOST_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 &&
                     x.is_contiguous(), what, ": x must be a contiguous 2-D bf16 CUDA tensor");
  MOK_HOST_CHECK(x.size(1) % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0,
                 what, ": rows must be whole 16-byte vectors (columns a multiple of 8, "
                 "16-byte aligned), got ", x.size(1), " columns");
  MOK_HOST_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() &&
                     out.sizes() == x.sizes() && out.device() == x.device(),
                 what, ": out must be a contiguous bf16 tensor of x's shape on x's device");
}

// Scale-block lengths the quantizers are built for: MXFP8's 32 and the blockwise recipe's 128.
void check_block(int64_t block, const char* what) {
  MOK_HOST_CHECK(block == kMxBlock || block == kFp8ScaleBlock, what, ": block must be ",
                 kMxBlock, " (MXFP8) or ", kFp8ScaleBlock, " (blockwise FP8), got ", block);
}

// The columns kernel numbers blocks, and the scale layouts rows, in 32 bits (with a warp's
// slack): a call over more blocks is refused.
void check_block_count(const at::Tensor& x, int64_t block, const char* what) {
  const int64_t per_row = (x.size(1) + block - 1) / block;
  MOK_HOST_CHECK(x.size(0) * per_row < (int64_t{1} << 31) - (1 << 20), what,
                 ": a call takes fewer than 2^31 - 2^20 scale blocks, got ", x.size(0),
                 " rows of ", per_row);
}

}  // namespace

void mx_round_columns(const at::Tensor& x, const c10::optional<at::Tensor>& num_rows,
                      at::Tensor& out) {
  check_operand(x, out, "mx_round_columns");
  check_block_count(x, kMxBlock, "mx_round_columns");
  if (num_rows.has_value()) {
    MOK_HOST_CHECK(num_rows->scalar_type() == at::kInt && num_rows->numel() == 1 &&
                       num_rows->device() == x.device(),
                   "mx_round_columns: num_rows must be one int32 on x's device");
  }
  if (x.numel() == 0) return;
  const int threads = kMxRoundThreads;
  const int blocks = at::cuda::getCurrentDeviceProperties()->multiProcessorCount * kBlocksPerSm;
  mx_round_columns_kernel<kMxBlock, false, ScaleLayout>
      <<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
          reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), x.size(0),
          num_rows.has_value() ? num_rows->data_ptr<int32_t>() : nullptr,
          static_cast<int>(x.size(1)),
          ColumnsOut<ScaleLayout>{reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), nullptr, 0,
                                  {}});
  MOK_LAUNCH_CHECK();
}

void mx_round_segments(const at::Tensor& x, const c10::optional<at::Tensor>& offsets,
                       int64_t segment_rows, int64_t block, at::Tensor& out) {
  check_operand(x, out, "mx_round_segments");
  check_block(block, "mx_round_segments");
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
  if (block == kFp8ScaleBlock) {
    fp8_round_segments(x, offsets.has_value() ? offsets->data_ptr<int32_t>() : nullptr, segments,
                       segment_rows, out);
    return;
  }
  // Row blocks: at most one per `block` rows plus one short one per segment.
  const int64_t worst = x.size(0) / block + segments;
  const int col_blocks =
      static_cast<int>((x.size(1) / 8 + kMxRoundThreads - 1) / kMxRoundThreads);
  const int64_t wanted = static_cast<int64_t>(
      at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * kBlocksPerSm * 4;
  const dim3 grid(col_blocks, static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>({worst, (wanted + col_blocks - 1) / col_blocks,
                                              65535}))));
  mx_round_segments_kernel<<<grid, kMxRoundThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), static_cast<int>(x.size(1)),
      offsets.has_value() ? offsets->data_ptr<int32_t>() : nullptr, static_cast<int>(segments),
      segment_rows, reinterpret_cast<__nv_bfloat16*>(out.data_ptr()));
  MOK_LAUNCH_CHECK();
}

namespace {

// Blocks along the rows of each matrix of w [E, r, c], written transposed: the codes of
// column j of matrix e are row j of codes[e] ([c, r] with rows code_row bytes apart) and the
// scale of (j, block b) goes to layout.at(e * c + j, b): a weight in its dgrad orientation,
// without a transposed bf16 copy. A thread owns 8 columns and one block of rows: a pass for
// the amax, then 16 rows at a time rounded and stored as 16 bytes per column.
template <int kBlock>
__global__ void mx_quantize_rows_t_kernel(const __nv_bfloat16* __restrict__ w, int64_t E,
                                          int64_t r, int c, uint8_t* __restrict__ codes,
                                          int64_t code_row, int64_t code_matrix,
                                          ScaleLayout layout) {
  static_assert(kBlock % 16 == 0, "whole 16-byte code vectors per block");
  const int vecs = c / 8;
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vecs) return;
  const int64_t blocks = (r + kBlock - 1) / kBlock;
  const int4* in = reinterpret_cast<const int4*>(w);
  for (int64_t eb = blockIdx.y; eb < E * blocks; eb += gridDim.y) {
    const int64_t e = eb / blocks, b = eb % blocks, r0 = b * kBlock;
    const int len = static_cast<int>(min(static_cast<int64_t>(kBlock), r - r0));
    const int4* src = in + (e * r + r0) * vecs + v;
    const ColumnBlock block(src, vecs, len);
    for (int i0 = 0; i0 < len; i0 += 16) {
      uint32_t q[8][4];
      block.codes16(src, vecs, i0, len, q);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint8_t* dst = codes + e * code_matrix + (8 * v + j) * code_row + r0 + i0;
        if (i0 + 16 <= len) {
          *reinterpret_cast<int4*>(dst) = make_int4(q[j][0], q[j][1], q[j][2], q[j][3]);
        } else {
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            if (i < len - i0) dst[i] = uint8_t(q[j][i / 4] >> (8 * (i % 4)));
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      layout.scales[layout.at(e * c + 8 * v + j, static_cast<int>(b))] =
          block.finite[j] ? static_cast<uint8_t>(block.e[j] + kE8m0Bias) : kE8m0Nan;
    }
  }
}

// The scale tensor of a quantizer writing x's `rows` rows as matrices of `matrix_rows`.
ScaleLayout scale_layout(const at::Tensor& scales, const at::Tensor& x, int64_t rows,
                         int64_t matrix_rows, int64_t halves, int64_t blocks, const char* what) {
  MOK_HOST_CHECK(matrix_rows > 0 && rows % matrix_rows == 0 && halves >= 1 &&
                     matrix_rows % halves == 0,
                 what, ": ", rows, " rows are not whole matrices of ", matrix_rows, " rows in ",
                 halves, " halves");
  const int64_t half_rows = matrix_rows / halves;
  MOK_HOST_CHECK(rows < (int64_t{1} << 31), what, ": ScaleLayout splits rows in 32 bits, got ",
                 rows, " rows");
  MOK_HOST_CHECK(scales.device() == x.device() && scales.scalar_type() == at::kByte &&
                     scales.is_contiguous() && scales.dim() == 4 &&
                     scales.size(0) == rows / matrix_rows && scales.size(1) == blocks &&
                     scales.size(2) == halves && scales.size(3) >= half_rows,
                 what, ": scales must be contiguous uint8 [", rows / matrix_rows, ", ", blocks,
                 ", ", halves, ", >= ", half_rows, "] on x's device, got ", scales.sizes());
  return ScaleLayout{scales.data_ptr<uint8_t>(), matrix_rows, half_rows, scales.size(3),
                     static_cast<int>(halves), static_cast<int>(blocks)};
}

void check_codes(const at::Tensor& codes, const at::Tensor& x, int64_t rows, int64_t cols,
                 const char* what) {
  MOK_HOST_CHECK(codes.device() == x.device() && codes.element_size() == 1 &&
                     codes.size(-2) * (codes.dim() == 3 ? codes.size(0) : 1) == rows &&
                     codes.size(-1) == cols && codes.stride(-1) == 1 &&
                     codes.stride(-2) % 16 == 0 &&
                     (codes.dim() == 2 || codes.stride(0) == codes.stride(1) * codes.size(1)) &&
                     reinterpret_cast<uintptr_t>(codes.data_ptr()) % 16 == 0,
                 what, ": codes must be one-byte [", rows, ", ", cols, "] (or stacked) on x's "
                 "device, rows 16-byte aligned and evenly strided");
}

void check_quantized_operand(const at::Tensor& x, const char* what) {
  MOK_HOST_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 &&
                     x.is_contiguous() && x.size(1) % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
                 what, ": x must be contiguous 2-D bf16 on the GPU with a multiple of 8 "
                 "columns, got ", x.sizes());
}

// The codes pass over x's rows (the first *num_rows when given) into dst.
template <class Scales>
void launch_codes(const at::Tensor& x, const c10::optional<at::Tensor>& num_rows,
                  const ColumnsOut<Scales>& dst, int64_t block) {
  check_block_count(x, block, "the columns quantizer");
  const int grid = at::cuda::getCurrentDeviceProperties()->multiProcessorCount * kBlocksPerSm;
  auto kernel = block == kMxBlock ? mx_round_columns_kernel<kMxBlock, true, Scales>
                                  : mx_round_columns_kernel<kFp8ScaleBlock, true, Scales>;
  kernel<<<grid, kMxRoundThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), x.size(0),
      num_rows.has_value() ? num_rows->data_ptr<int32_t>() : nullptr,
      static_cast<int>(x.size(1)), dst);
  MOK_LAUNCH_CHECK();
}

}  // namespace

void mx_quantize_columns(const at::Tensor& x, const c10::optional<at::Tensor>& num_rows,
                         at::Tensor& codes, at::Tensor& scales, int64_t matrix_rows,
                         int64_t halves, int64_t block) {
  check_block(block, "mx_quantize_columns");
  if (num_rows.has_value()) {
    MOK_HOST_CHECK(num_rows->scalar_type() == at::kInt && num_rows->numel() == 1 &&
                       num_rows->device() == x.device(),
                   "mx_quantize_columns: num_rows must be one int32 on x's device");
  }
  check_quantized_operand(x, "mx_quantize_columns");
  const int64_t rows = x.size(0), cols = x.size(1), blocks = (cols + block - 1) / block;
  check_codes(codes, x, rows, cols, "mx_quantize_columns");
  const ScaleLayout layout =
      scale_layout(scales, x, rows, matrix_rows, halves, blocks, "mx_quantize_columns");
  if (x.numel() == 0) return;
  launch_codes(x, num_rows, ColumnsOut<ScaleLayout>{
      nullptr, reinterpret_cast<uint8_t*>(codes.data_ptr()), codes.stride(-2), layout}, block);
}

void quantize_wire_rows(const at::Tensor& x, at::Tensor& buffer, int64_t offset,
                        int64_t row_bytes, int64_t code_bytes, int64_t block) {
  check_block(block, "quantize_wire_rows");
  check_quantized_operand(x, "quantize_wire_rows");
  const int64_t rows = x.size(0), cols = x.size(1), blocks = (cols + block - 1) / block;
  MOK_HOST_CHECK(code_bytes >= cols && code_bytes % 16 == 0 && row_bytes % 16 == 0 &&
                     row_bytes >= code_bytes + blocks && offset % 16 == 0,
                 "quantize_wire_rows: rows of ", row_bytes, " bytes with codes in the first ",
                 code_bytes, " do not hold ", cols, " codes and ", blocks, " scale codes in "
                 "16-byte aligned rows");
  MOK_HOST_CHECK(buffer.is_contiguous() && buffer.scalar_type() == at::kByte &&
                     buffer.device() == x.device() &&
                     reinterpret_cast<uintptr_t>(buffer.data_ptr()) % 16 == 0 &&
                     offset >= 0 && offset + rows * row_bytes <= buffer.numel(),
                 "quantize_wire_rows: ", rows, " rows of ", row_bytes, " bytes at ", offset,
                 " do not fit the ", buffer.numel(), "-byte buffer on x's device");
  if (x.numel() == 0) return;
  uint8_t* wire = buffer.data_ptr<uint8_t>() + offset;
  launch_codes(x, c10::nullopt,
               ColumnsOut<RowScales>{nullptr, wire, row_bytes, {wire + code_bytes, row_bytes}},
               block);
}

void mx_quantize_rows_transposed(const at::Tensor& w, at::Tensor& codes, at::Tensor& scales) {
  MOK_HOST_CHECK(w.is_cuda() && w.dim() == 3 && w.scalar_type() == at::kBFloat16 &&
                     w.is_contiguous() && w.size(2) % 8 == 0,
                 "mx_quantize_rows_transposed: w must be contiguous bf16 [E, r, c] on the GPU "
                 "with c a multiple of 8, got ", w.sizes());
  const int64_t E = w.size(0), r = w.size(1), c = w.size(2);
  const int64_t blocks = (r + kMxBlock - 1) / kMxBlock;
  MOK_HOST_CHECK(codes.dim() == 3 && codes.size(0) == E, "mx_quantize_rows_transposed: codes "
                 "must be [E, c, r]");
  check_codes(codes, w, E * c, r, "mx_quantize_rows_transposed");
  const ScaleLayout layout =
      scale_layout(scales, w, E * c, c, 1, blocks, "mx_quantize_rows_transposed");
  if (w.numel() == 0) return;
  const int col_blocks = static_cast<int>((c / 8 + kMxRoundThreads - 1) / kMxRoundThreads);
  const int64_t wanted = static_cast<int64_t>(
      at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * kBlocksPerSm * 4;
  const dim3 grid(col_blocks, static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>({E * blocks, (wanted + col_blocks - 1) / col_blocks, 65535}))));
  mx_quantize_rows_t_kernel<kMxBlock><<<grid, kMxRoundThreads, 0,
                                        at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(w.data_ptr()), E, r, static_cast<int>(c),
      reinterpret_cast<uint8_t*>(codes.data_ptr()), codes.stride(1), codes.stride(0), layout);
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
