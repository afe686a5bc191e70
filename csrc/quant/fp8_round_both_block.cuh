// One unit of the blockwise recipe's rounding both ways (blocks of 128 along each row and
// along the rows): up to 128 rows of one segment x 128 columns, by 256 threads. Shared by the
// separate path's both-forms pass (quant/mx_round_both.cu: a CTA per unit) and the backward
// megakernel's rounding tiles under the recipe (megakernel/fp8_round_tile.cuh: both consumer
// warpgroups of a block per unit), so both write the same bits.
//
// Thread t holds rows t / 16 + 16 i (i < 8) at vector t % 16, so a row's block is 16
// consecutive lanes (four shuffles) and a column's block is the thread's 8 rows, the other
// row group of its warp (one shuffle) and the unit's 8 warps (shared memory).
//   along K    (kAlongK) the FP8 engine's A operand: E4M3 codes and E8M0 scale codes
//              transposed ([block][row]: ops.fp8_quantize_rows' layout);
//   along rows bf16 values as mx_round_segments<128> writes them.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "config/kernel_config.cuh"
#include "quant/fp8_rows.h"
#include "quant/mx_block_scale.cuh"
#include "quant/mx_format.cuh"

namespace mok {

constexpr int kWideBlock = kFp8ScaleBlock;
constexpr int kWideThreads = 256;
constexpr int kWideLanes = kWideBlock / 8;                    // a row's block: 16 lanes
constexpr int kWideRowsPerPass = kWideThreads / kWideLanes;   // 16 row groups
constexpr int kWidePasses = kWideBlock / kWideRowsPerPass;    // 8 rows per thread
static_assert(kWideLanes == 16 && kWidePasses == 8, "two row groups per warp, 8 rows each");

// Per warp of the unit, its column maxima (column pairs, as block_maxima packs them).
using WideColumnMaxima = uint32_t[kWideThreads / 32][kWideBlock / 2];

// Threads t = 0 .. 255 of the unit call it together; `sync()` is their barrier (run twice).
// Rows r0 .. r0 + len - 1 of src (len <= 128, the rest count as zeros and are not written),
// columns of block `span` (vector span * 16 + t % 16 of vecs per row; vectors past vecs
// hold zeros and write nothing). along_n may be src's own memory: a thread writes only
// vectors it read, after every thread's loads.
template <bool kAlongK, class Rows, class Sync>
__device__ __forceinline__ void fp8_round_both_block(const Rows& src, int64_t r0, int len,
                                                     int span, int vecs, const Fp8Rows& out,
                                                     int4* along_n, WideColumnMaxima& warp_col_max,
                                                     int t, Sync sync) {
  const int lane = t % 32, warp = t / 32;
  const int g = t % kWideLanes, row_group = t / kWideLanes;
  const int v = span * kWideLanes + g;  // this thread's vector
  const bool here = v < vecs;
  uint32_t x[kWidePasses][4];
#pragma unroll
  for (int i = 0; i < kWidePasses; ++i) {
    const int r = row_group + kWideRowsPerPass * i;
    const int4 v4 = here && r < len ? src.row(r0 + r)[v] : make_int4(0, 0, 0, 0);
    x[i][0] = v4.x, x[i][1] = v4.y, x[i][2] = v4.z, x[i][3] = v4.w;
  }
  uint32_t col_max[4], row_max[kWidePasses / 2];
  block_maxima(x, col_max, row_max);
  if constexpr (kAlongK) {
#pragma unroll
    for (int p = 0; p < kWidePasses / 2; ++p) {
#pragma unroll
      for (int d = 1; d < kWideLanes; d *= 2) {
        row_max[p] = larger_halves(row_max[p], __shfl_xor_sync(0xffffffffu, row_max[p], d));
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    col_max[k] = larger_halves(col_max[k], __shfl_xor_sync(0xffffffffu, col_max[k], kWideLanes));
    if (lane < kWideLanes) warp_col_max[warp][4 * g + k] = col_max[k];
  }
  sync();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
#pragma unroll
    for (int other = 0; other < kWideThreads / 32; ++other) {
      col_max[k] = larger_halves(col_max[k], warp_col_max[other][4 * g + k]);
    }
  }
  sync();  // every warp has read warp_col_max before it is written again
  if (!here) return;
  BlockScale col[8];
  column_scales(col_max, col);
#pragma unroll
  for (int i = 0; i < kWidePasses; ++i) {
    const int r = row_group + kWideRowsPerPass * i;
    if constexpr (kAlongK) {
      const BlockScale row(i % 2 == 0 ? row_max[i / 2] & 0xFFFFu : row_max[i / 2] >> 16);
      uint32_t q[2];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t pair =
            row.finite ? code_pair(bf16_of(x[i][k], 0), bf16_of(x[i][k], 1), row.down, row.down)
                       : (uint32_t(kE4m3Nan) << 8 | kE4m3Nan);
        q[k / 2] = k % 2 == 0 ? pair : q[k / 2] | (pair << 16);
      }
      if (r < len) {
        *reinterpret_cast<uint2*>(out.codes + (r0 + r) * out.code_stride + 8 * v) =
            make_uint2(q[0], q[1]);
        if (g == 0) {
          out.scales[span * out.scale_stride + r0 + r] =
              row.finite ? static_cast<uint8_t>(row.e + kE8m0Bias) : kE8m0Nan;
        }
      }
    }
    const int4 n = round_vector(x[i], &col[0], &col[1], 2);
    if (r < len) along_n[(r0 + r) * vecs + v] = n;
  }
}

}  // namespace mok
