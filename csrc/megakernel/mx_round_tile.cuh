// The backward megakernel's rounding tiles under MXFP8 (docs/mxfp8.md has the reference; the
// table in mok_megatron/cuda/operands.py says which GEMM reads which form). dY, x and dh are read
// twice, along K by a dgrad or FC1 (blocks of 32 along each row) and along the expert's rows
// by a weight gradient (blocks of 32 rows from the expert's first row), act only by dW2
// (along the rows). Rounding inside every GEMM stage that reads an operand would round each
// element once per tile reading it (8-28 tiles; a wgrad stage's rounding costs more issue
// slots than its MMAs), so a tile per (m-block, kRoundCols columns) rounds them once, after
// the m-block's producer (the pull, FC1 or FC2-dgrad) and before its readers:
//   along K    into a buffer of its own (rows_k, dout_k, dh_k);
//   along rows in place, over the operand as produced: only rounding tiles read that.
// An m-block starts at its expert's first row + 128 i, so a consumer warpgroup's 64 rows are
// two whole 32-row blocks of the reference's; rows past the expert's end count as zeros and
// are not written. The arithmetic is the separate path's both-forms pass
// (quant/mx_round_span.cuh), so both give the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "quant/mx_round_span.cuh"

namespace mok {

constexpr int kRoundSpans = kRoundCols / kMxSpanCols;
constexpr int kRoundUnits = (sm90::kStagedRows / kMxBlock) * kRoundSpans;  // per warpgroup
static_assert(kRoundCols % kMxSpanCols == 0 && sm90::kStagedRows % kMxBlock == 0,
              "a rounding tile is whole spans of whole 32-row blocks per warpgroup");

// One consumer warpgroup's rows of a rounding tile (t: its thread, 0..127): rows
// [row0, row0 + 64) of src [.., cols], the first rows_valid of them the expert's, columns
// [col0, col0 + kRoundCols) of it. along_k / along_n: as mx_round_span.
template <bool kAlongK, bool kAlongN>
__device__ __forceinline__ void round_tile_rows(const __nv_bfloat16* src,
                                                __nv_bfloat16* along_k, __nv_bfloat16* along_n,
                                                int cols, int64_t row0, int rows_valid,
                                                int col0, int t) {
  const int warp = t / 32, lane = t % 32, quarter = lane / 8, g = lane % 8;
  const int vecs = cols / 8;
  const MatrixRows rows{reinterpret_cast<const int4*>(src), vecs};
  for (int u = warp; u < kRoundUnits; u += 4) {
    const int block = u / kRoundSpans;
    const int span_col = col0 + (u % kRoundSpans) * kMxSpanCols;
    // Whole warps skip a unit with no rows or no columns (before the span's shuffles).
    if (block * kMxBlock >= rows_valid || span_col >= cols) continue;
    const int lane_row = block * kMxBlock + quarter * kMxSpanLaneRows;
    const int n = max(0, min(kMxSpanLaneRows, rows_valid - lane_row));
    mx_round_span<kAlongK, kAlongN>(rows, row0 + lane_row, n, span_col / 8 + g, vecs,
                                    reinterpret_cast<int4*>(along_k),
                                    reinterpret_cast<int4*>(along_n));
  }
}

}  // namespace mok
