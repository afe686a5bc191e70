// One block of a bf16 matrix along its rows, 8 columns wide: the scale exponent and
// finiteness of each column's block, the first pass of every quantizer that cuts blocks along
// rows (quant/mx_round.cu: the segment rounding and the transposed weight quantizer); and how
// row blocks are numbered over segments and which segment a block belongs to.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/vec.cuh"
#include "quant/mx_format.cuh"

namespace mok {

// A block along rows of 8 columns: `len` rows of one 16-byte vector each, `stride` vectors
// apart from `first`. Per column the scale exponent of its finite values' amax, and whether
// all of them are finite (a NaN or an Inf makes the column's block NaN).
struct ColumnBlock {
  int e[8];
  bool finite[8];

  __device__ ColumnBlock(const int4* first, int64_t stride, int len) {
    float amax[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 8; ++j) finite[j] = true;
    for (int i = 0; i < len; ++i) {
      Bf16x8 row;
      row.raw = first[i * stride];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float f = __bfloat162float(row.v[j]);
        const bool ok = isfinite(f);
        finite[j] &= ok;
        if (ok) amax[j] = fmaxf(amax[j], fabsf(f));
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) e[j] = mx_scale_exponent(amax[j]);
  }

  // The E4M3 codes of the block's rows i0 .. i0 + 15 (`first`, `stride` as given to the
  // constructor): column j's 16 codes in q[j], 4 per word; rows at or past `len` are zero
  // codes.
  __device__ void codes16(const int4* first, int64_t stride, int i0, int len,
                          uint32_t (&q)[8][4]) const {
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j][0] = q[j][1] = q[j][2] = q[j][3] = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (i0 + i >= len) break;
      Bf16x8 row;
      row.raw = first[(i0 + i) * stride];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t code = finite[j] ? mx_code(__bfloat162float(row.v[j]), e[j]) : kE4m3Nan;
        q[j][i / 4] |= code << (8 * (i % 4));
      }
    }
  }
};

// Segment s: rows [offsets[s], offsets[s+1]), or [s * segment_rows, (s+1) * segment_rows)
// when offsets is null.
__device__ __forceinline__ int64_t segment_begin(const int32_t* __restrict__ offsets,
                                                 int64_t segment_rows, int s) {
  return offsets != nullptr ? offsets[s] : s * segment_rows;
}

// Numbers the row blocks of every segment (segment_begin), segment by segment: first_block[s]
// is segment s's first block, first_block[segments] the total; a segment's last block may be
// short. One thread of the CTA calls it (into shared memory), before a barrier.
template <int kBlock>
__device__ void number_row_blocks(const int32_t* __restrict__ offsets, int segments,
                                  int64_t segment_rows, int64_t* first_block) {
  int64_t sum = 0;
  for (int s = 0; s < segments; ++s) {
    first_block[s] = sum;
    const int64_t len = offsets != nullptr ? offsets[s + 1] - offsets[s] : segment_rows;
    sum += (len + kBlock - 1) / kBlock;
  }
  first_block[segments] = sum;
}

// The segment holding row block b, given where each segment's blocks start (first_block
// [segments + 1]): the last s with first_block[s] <= b. An empty segment owns no blocks, so
// the search passes over it to the segment that owns b.
template <class Index>
__device__ __forceinline__ int segment_of_block(const Index* first_block, int segments,
                                                int64_t b) {
  int lo = 0, hi = segments - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= b) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace mok
