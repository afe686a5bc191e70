// One warp's unit of MXFP8 rounding both ways (blocks of 32 along each row and along the
// rows): 32 rows of one segment x 64 columns. Shared by the separate path's both-forms pass
// (quant/mx_round_both.cu) and the backward megakernel's rounding tiles
// (megakernel/mx_round_tile.cuh), so both write the same bits.
//
// Lane 8 * quarter + g holds rows 8 * quarter .. 8 * quarter + 7 of the block at columns
// 8 * g .. 8 * g + 7 of the span, one 16-byte vector per row, all 8 loads in flight together.
// Along a row a 32-column block is 4 consecutive lanes (two shuffles); along the rows a
// column's block is the lane's 8 rows and those of the same g in the other quarters (two
// shuffles). (16 rows per lane held 64 registers of values and spilled at the 128 that 2 CTAs
// per SM allow.)
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "config/kernel_config.cuh"
#include "quant/mx_block_scale.cuh"

namespace mok {

constexpr int kMxSpanLaneRows = kMxBlock / 4;  // rows of a block one lane holds
constexpr int kMxSpanCols = 8 * 8;             // columns of a span: 8 lanes x 8
static_assert(kMxBlock == 32, "a block of rows is the four quarters of a warp");

// The rows of a bf16 matrix [rows, vecs 16-byte vectors].
struct MatrixRows {
  const int4* x;
  int vecs;

  __device__ const int4* row(int64_t r) const { return x + r * vecs; }
};

// The whole warp calls it. This lane's rows are r0 .. r0 + kMxSpanLaneRows - 1 of `src`, of
// which the first `rows` are the segment's (the others count as zeros and are not written),
// at vector v of vecs per row (lanes with v >= vecs hold zeros and write nothing). Writes the
// rows rounded along each row into along_k (kAlongK) and along the rows into along_n
// (kAlongN), both [.., vecs] like the source; either may be the source's own memory: a lane
// writes only the vectors it read, after every lane's loads.
template <bool kAlongK, bool kAlongN, class Rows>
__device__ __forceinline__ void mx_round_span(const Rows& src, int64_t r0, int rows, int v,
                                              int vecs, int4* along_k, int4* along_n) {
  static_assert(kAlongK || kAlongN, "at least one form");
  const bool here = v < vecs;
  uint32_t x[kMxSpanLaneRows][4];
#pragma unroll
  for (int i = 0; i < kMxSpanLaneRows; ++i) {
    const int4 v4 = here && i < rows ? src.row(r0 + i)[v] : make_int4(0, 0, 0, 0);
    x[i][0] = v4.x, x[i][1] = v4.y, x[i][2] = v4.z, x[i][3] = v4.w;
  }
  uint32_t col_max[4], row_max[kMxSpanLaneRows / 2];
  block_maxima(x, col_max, row_max);
  if constexpr (kAlongN) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      col_max[k] = larger_halves(col_max[k], __shfl_xor_sync(0xffffffffu, col_max[k], 8));
      col_max[k] = larger_halves(col_max[k], __shfl_xor_sync(0xffffffffu, col_max[k], 16));
    }
  }
  if constexpr (kAlongK) {
#pragma unroll
    for (int p = 0; p < kMxSpanLaneRows / 2; ++p) {
      row_max[p] = larger_halves(row_max[p], __shfl_xor_sync(0xffffffffu, row_max[p], 1));
      row_max[p] = larger_halves(row_max[p], __shfl_xor_sync(0xffffffffu, row_max[p], 2));
    }
  }
  if (!here) return;
  BlockScale col[8];
  column_scales(col_max, col);
#pragma unroll
  for (int i = 0; i < kMxSpanLaneRows; ++i) {
    const BlockScale row(i % 2 == 0 ? row_max[i / 2] & 0xFFFFu : row_max[i / 2] >> 16);
    const int4 k = round_vector(x[i], &row, &row, 0);
    const int4 n = round_vector(x[i], &col[0], &col[1], 2);
    if (i < rows) {
      const int64_t at = (r0 + i) * vecs + v;
      if constexpr (kAlongK) along_k[at] = k;
      if constexpr (kAlongN) along_n[at] = n;
    }
  }
}

}  // namespace mok
