// One operand rounded both ways in one pass: the separate path's backward under an FP8 recipe
// (mok_megatron/cuda/operands.py). Backward reads dY, dh and the recomputed token rows twice, along
// K by a dgrad or FC1 (blocks along each row) and along each expert's rows by wgrad (blocks
// from the segment's first row). Rounding them once per reader (quant/mx_round.cu) read each
// operand twice and wrote it twice after the pull or kernel that produced it: 1.8 ms of a
// 14.1 ms MXFP8 backward at DeepSeek E=8 T=4096 (docs/perf-log.md, MXFP8, 2026-12-04). Here one pass reads it
// once and writes both forms, bit for bit what the one-way kernels write, the rows read from
// a bf16 matrix or pulled straight from the peers' published rows (a pulled operand never
// lands unrounded). Rows outside every segment are not written.
//
// MXFP8 (mx_round_both_kernel, blocks of 32 both ways): both forms bf16 values, as
// mx_round_columns and mx_round_segments write them. A warp takes one block of rows (<= 32
// rows of one segment) x 64 columns (quant/mx_round_span.cuh).
//
// Blockwise FP8 (fp8_round_blocks_kernel, blocks of 128 both ways): along K the FP8
// engine's A operand as mx_quantize_columns writes it (E4M3 codes, E8M0 scale codes
// transposed: ops.fp8_quantize_rows' layout), along the rows bf16 values as
// mx_round_segments<128> writes them. A CTA takes one block of rows (<= 128 rows of one
// segment) x 128 columns (quant/fp8_round_both_block.cuh, shared with the backward
// megakernel's rounding tiles). The same units along the rows alone are mx_round_segments with
// 128-row blocks (fp8_round_segments): its own kernel walks a block's rows one at a time per
// thread, twice (quant/mx_round.cu), and ran at ~0.8 TB/s on act (docs/perf-log.md, Blockwise FP8, 2026-12-05).
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "comm/peer_row.cuh"
#include "common/error.cuh"
#include "common/vec.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"
#include "quant/column_block.cuh"
#include "quant/fp8_round_both_block.cuh"
#include "quant/mx_block_scale.cuh"
#include "quant/mx_format.cuh"
#include "quant/mx_round_span.cuh"
#include "quant/round_segments.h"

namespace mok {
namespace {

constexpr int kCtasPerSm = 2;  // 124 registers per thread, no spills

// The schedule's rows in the peers' published token rows (a pull, as comm/rows.cu's), the
// slot arithmetic in 32 bits (comm/peer_row.cuh).
struct PeerRows {
  const int64_t* peer_bases;
  int64_t offset;
  const int32_t* row_slot;
  uint32_t per_rank;  // max_tokens * topk
  uint32_t topk;
  int64_t row_bytes;

  __device__ const int4* row(int64_t r) const {
    return reinterpret_cast<const int4*>(peer_row<uint32_t>(
        peer_bases, offset, static_cast<uint32_t>(row_slot[r]), per_rank, topk, row_bytes));
  }
};

template <class Rows>
__global__ void __launch_bounds__(kMxRoundThreads, kCtasPerSm)
    mx_round_both_kernel(Rows src, int cols, const int32_t* __restrict__ offsets, int segments,
                         int4* __restrict__ along_k, int4* __restrict__ along_n) {
  __shared__ int64_t first_block[kGemmMaxExperts + 1];
  if (threadIdx.x == 0) number_row_blocks<kMxBlock>(offsets, segments, 0, first_block);
  __syncthreads();
  const int lane = threadIdx.x % 32, quarter = lane / 8, g = lane % 8;
  const int vecs = cols / 8;
  const int spans = (cols + kMxSpanCols - 1) / kMxSpanCols;
  const int64_t work = first_block[segments] * spans;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       w < work; w += warps) {
    const int64_t b = w / spans;
    const int v = static_cast<int>(w % spans) * (kMxSpanCols / 8) + g;  // this lane's vector
    const int s = segment_of_block(first_block, segments, b);
    const int64_t r0 = offsets[s] + (b - first_block[s]) * kMxBlock + quarter * kMxSpanLaneRows;
    const int rows = static_cast<int>(max(
        int64_t{0}, min(static_cast<int64_t>(kMxSpanLaneRows), offsets[s + 1] - r0)));
    mx_round_span<true, true>(src, r0, rows, v, vecs, along_k, along_n);
  }
}

// Segments as quant/column_block.cuh's segment_begin gives them.
template <bool kAlongK, class Rows>
__global__ void __launch_bounds__(kWideThreads, kCtasPerSm)
    fp8_round_blocks_kernel(Rows src, int cols, const int32_t* __restrict__ offsets,
                            int segments, int64_t segment_rows, Fp8Rows out,
                            int4* __restrict__ along_n) {
  __shared__ int64_t first_block[kGemmMaxExperts + 1];
  __shared__ WideColumnMaxima warp_col_max;
  if (threadIdx.x == 0) number_row_blocks<kWideBlock>(offsets, segments, segment_rows, first_block);
  __syncthreads();
  const int vecs = cols / 8;
  const int spans = (cols + kWideBlock - 1) / kWideBlock;
  const int64_t work = first_block[segments] * spans;
  for (int64_t w = blockIdx.x; w < work; w += gridDim.x) {
    const int64_t b = w / spans;
    const int s = segment_of_block(first_block, segments, b);
    const int64_t r0 = segment_begin(offsets, segment_rows, s) + (b - first_block[s]) * kWideBlock;
    const int64_t end = segment_begin(offsets, segment_rows, s + 1);
    const int len = static_cast<int>(min(static_cast<int64_t>(kWideBlock), end - r0));
    fp8_round_both_block<kAlongK>(src, r0, len, static_cast<int>(w % spans), vecs, out, along_n,
                                  warp_col_max, threadIdx.x, [] { __syncthreads(); });
  }
}

// Checks the offsets and the bf16 output `what` names against [rows, cols] on `device`, and
// returns the number of segments.
int64_t check_both(const at::Tensor& offsets, const at::Tensor& out, int64_t rows, int64_t cols,
                   const c10::Device& device, const char* what) {
  MOK_HOST_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() && out.dim() == 2 &&
                     out.size(0) == rows && out.size(1) == cols && out.device() == device &&
                     reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0,
                 what, ": the bf16 outputs must be contiguous and 16-byte aligned [", rows, ", ",
                 cols, "] on the rows' device, got ", out.sizes());
  MOK_HOST_CHECK(cols % 8 == 0, what, ": rows must be whole 16-byte vectors (columns a "
                 "multiple of 8), got ", cols, " columns");
  MOK_HOST_CHECK(offsets.scalar_type() == at::kInt && offsets.dim() == 1 &&
                     offsets.numel() >= 2 && offsets.is_contiguous() &&
                     offsets.device() == device,
                 what, ": offsets must be int32 [segments + 1] on the rows' device");
  const int64_t segments = offsets.numel() - 1;
  MOK_HOST_CHECK(segments <= kGemmMaxExperts, what, ": ", segments, " segments exceed ",
                 kGemmMaxExperts);
  return segments;
}

// CTAs for `units` units of work of `per_cta` each: all resident at kCtasPerSm per SM, fewer
// when there is less work.
int grid_for(int64_t units, int64_t per_cta) {
  const int64_t resident =
      static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) *
      kCtasPerSm;
  return static_cast<int>(
      std::max<int64_t>(1, std::min(resident, (units + per_cta - 1) / per_cta)));
}

// Where an operand's rows come from: x [rows, cols], or the schedule's rows pulled from the
// peers' bf16 token rows (rows = the outputs', cols = H).
struct Source {
  const at::Tensor* x;
  const at::Tensor* peer_bases;
  int64_t src_offset;
  const at::Tensor* row_slot;
  int64_t max_tokens, topk;

  template <class Run>
  void visit(int64_t rows, int64_t cols, const char* what, Run run) const {
    if (x != nullptr) {
      MOK_HOST_CHECK(x->is_cuda() && x->dim() == 2 && x->scalar_type() == at::kBFloat16 &&
                         x->is_contiguous() && x->size(0) == rows && x->size(1) == cols &&
                         reinterpret_cast<uintptr_t>(x->data_ptr()) % 16 == 0,
                     what, ": x must be a contiguous 16-byte aligned bf16 CUDA tensor [", rows,
                     ", ", cols, "], got ", x->sizes());
      run(MatrixRows{reinterpret_cast<const int4*>(x->data_ptr()), static_cast<int>(cols / 8)});
      return;
    }
    MOK_HOST_CHECK(row_slot->scalar_type() == at::kInt && row_slot->is_contiguous() &&
                       row_slot->numel() >= rows && peer_bases->scalar_type() == at::kLong,
                   what, ": row_slot must be int32 with a slot per row, peer_bases int64");
    MOK_HOST_CHECK(src_offset % 16 == 0, what, ": the source region must be 16-byte aligned");
    MOK_HOST_CHECK(max_tokens > 0 && topk > 0 && max_tokens * topk <= INT32_MAX, what,
                   ": max_tokens x topk must be a positive int32");
    run(PeerRows{peer_bases->data_ptr<int64_t>(), src_offset, row_slot->data_ptr<int32_t>(),
                 static_cast<uint32_t>(max_tokens * topk), static_cast<uint32_t>(topk),
                 cols * 2});
  }
};

void mx_both(const Source& src, const at::Tensor& offsets, at::Tensor& along_k,
             at::Tensor& along_n, const char* what) {
  MOK_HOST_CHECK(along_k.dim() == 2, what, ": along_k must be [rows, cols]");
  const int64_t rows = along_k.size(0), cols = along_k.size(1);
  const c10::Device device = offsets.device();
  check_both(offsets, along_k, rows, cols, device, what);
  const int64_t segments = check_both(offsets, along_n, rows, cols, device, what);
  src.visit(rows, cols, what, [&](auto rows_of) {
    if (rows == 0 || cols == 0) return;
    // A warp per (row block, span): at most one block per 32 rows plus a short one per segment.
    const int64_t units = (rows / kMxBlock + segments) * ((cols + kMxSpanCols - 1) / kMxSpanCols);
    mx_round_both_kernel<<<grid_for(units, kMxRoundThreads / 32), kMxRoundThreads, 0,
                           at::cuda::getCurrentCUDAStream()>>>(
        rows_of, static_cast<int>(cols), offsets.data_ptr<int32_t>(), static_cast<int>(segments),
        reinterpret_cast<int4*>(along_k.data_ptr()), reinterpret_cast<int4*>(along_n.data_ptr()));
    MOK_LAUNCH_CHECK();
  });
}

// A CTA per (row block, span): at most one block per 128 rows plus a short one per segment.
template <bool kAlongK, class Rows>
void launch_round_blocks(const Rows& rows_of, int64_t rows, int64_t cols, const int32_t* offsets,
                         int64_t segments, int64_t segment_rows, const Fp8Rows& out,
                         at::Tensor& along_n) {
  const int64_t units = (rows / kWideBlock + segments) * ((cols + kWideBlock - 1) / kWideBlock);
  fp8_round_blocks_kernel<kAlongK><<<grid_for(units, 1), kWideThreads, 0,
                                     at::cuda::getCurrentCUDAStream()>>>(
      rows_of, static_cast<int>(cols), offsets, static_cast<int>(segments), segment_rows, out,
      reinterpret_cast<int4*>(along_n.data_ptr()));
  MOK_LAUNCH_CHECK();
}

void fp8_both(const Source& src, const at::Tensor& offsets, at::Tensor& codes,
              at::Tensor& scales, at::Tensor& along_n, const char* what) {
  MOK_HOST_CHECK(along_n.dim() == 2, what, ": along_n must be [rows, cols]");
  const int64_t rows = along_n.size(0), cols = along_n.size(1);
  const int64_t segments = check_both(offsets, along_n, rows, cols, offsets.device(), what);
  MOK_HOST_CHECK(codes.dim() == 2 && codes.element_size() == 1 && codes.size(0) == rows &&
                     codes.size(1) == cols && codes.stride(1) == 1 &&
                     codes.stride(0) % 16 == 0 && codes.device() == offsets.device() &&
                     reinterpret_cast<uintptr_t>(codes.data_ptr()) % 16 == 0,
                 what, ": codes must be one-byte [", rows, ", ", cols, "] with 16-byte aligned "
                 "rows");
  MOK_HOST_CHECK(scales.dim() == 2 && scales.scalar_type() == at::kByte &&
                     scales.is_contiguous() && scales.device() == offsets.device() &&
                     scales.size(0) == (cols + kWideBlock - 1) / kWideBlock &&
                     scales.size(1) >= rows,
                 what, ": scales must be uint8 [", (cols + kWideBlock - 1) / kWideBlock,
                 ", >= ", rows, "], got ", scales.sizes());
  src.visit(rows, cols, what, [&](auto rows_of) {
    if (rows == 0 || cols == 0) return;
    launch_round_blocks<true>(rows_of, rows, cols, offsets.data_ptr<int32_t>(), segments, 0,
                              Fp8Rows{static_cast<uint8_t*>(codes.data_ptr()), codes.stride(0),
                                      scales.data_ptr<uint8_t>(), scales.stride(0)},
                              along_n);
  });
}

}  // namespace

void fp8_round_segments(const at::Tensor& x, const int32_t* offsets, int64_t segments,
                        int64_t segment_rows, at::Tensor& out) {
  launch_round_blocks<false>(
      MatrixRows{reinterpret_cast<const int4*>(x.data_ptr()), static_cast<int>(x.size(1) / 8)},
      x.size(0), x.size(1), offsets, segments, segment_rows, Fp8Rows{}, out);
}

void mx_round_both(const at::Tensor& x, const at::Tensor& offsets, at::Tensor& along_k,
                   at::Tensor& along_n) {
  mx_both(Source{&x, nullptr, 0, nullptr, 0, 0}, offsets, along_k, along_n, "mx_round_both");
}

void pull_rows_mx_round_both(const at::Tensor& peer_bases, int64_t src_offset,
                             const at::Tensor& row_slot, const at::Tensor& offsets,
                             int64_t max_tokens, int64_t topk, at::Tensor& along_k,
                             at::Tensor& along_n) {
  mx_both(Source{nullptr, &peer_bases, src_offset, &row_slot, max_tokens, topk}, offsets,
          along_k, along_n, "pull_rows_mx_round_both");
}

void fp8_quantize_round_both(const at::Tensor& x, const at::Tensor& offsets, at::Tensor& codes,
                             at::Tensor& scales, at::Tensor& along_n) {
  fp8_both(Source{&x, nullptr, 0, nullptr, 0, 0}, offsets, codes, scales, along_n,
           "fp8_quantize_round_both");
}

void pull_rows_fp8_quantize_round_both(const at::Tensor& peer_bases, int64_t src_offset,
                                       const at::Tensor& row_slot, const at::Tensor& offsets,
                                       int64_t max_tokens, int64_t topk, at::Tensor& codes,
                                       at::Tensor& scales, at::Tensor& along_n) {
  fp8_both(Source{nullptr, &peer_bases, src_offset, &row_slot, max_tokens, topk}, offsets,
           codes, scales, along_n, "pull_rows_fp8_quantize_round_both");
}

}  // namespace mok
