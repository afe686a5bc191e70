// MXFP8 rounding of bf16 values with few instructions per value, shared by the both-forms
// passes (quant/mx_round_both.cu) and the forward megakernel's storer, which rounds act along
// F as FC2 reads it (megakernel/epilogue_storer.cuh): a block's amax from bf16 bit patterns,
// its scale once per block, two values per conversion. Bit for bit mx_round of quant/mx_round.cu
// (the reference's semantics, mok_megatron/recipes/mxfp8.py).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/vec.cuh"
#include "quant/mx_format.cuh"

namespace mok {

// A block's amax from the bf16 bit patterns: |v| is a value's pattern & 0x7FFF, and finite
// magnitudes order as those 15-bit patterns do while NaN and Inf (>= 0x7F80) exceed them all,
// so the max pattern of a block (two per word: __vmaxu2) is its amax's, or says it holds a NaN
// or an Inf. (Per-value float compares made the first version of these kernels issue-bound at
// 1.5-2.1 TB/s, docs/perf-log.md MXFP8, both forms, 2026-12-04.)
constexpr uint32_t kBf16Inf = 0x7F80;

__device__ __forceinline__ uint32_t magnitudes(uint32_t pair) { return pair & 0x7FFF7FFFu; }
__device__ __forceinline__ uint32_t larger_halves(uint32_t a, uint32_t b) {
  return __vmaxu2(a, b);
}

// A block's scale from its max magnitude pattern: the E8M0 exponent e (mxfp8.scale_exponent,
// as mx_scale_exponent of the amax) and the factors 2^-e and 2^e, the latter NaN for a block
// with a NaN or an Inf so that all its values come out NaN.
struct BlockScale {
  int e;
  bool finite;
  float down, up;

  BlockScale() = default;
  __device__ __forceinline__ explicit BlockScale(uint32_t max_pattern) {
    finite = max_pattern < kBf16Inf;
    e = mx_scale_exponent(__uint_as_float(max_pattern << 16));
    down = exact_exp2(-e);
    up = finite ? exact_exp2(e) : __uint_as_float(0x7FC00000u);
  }
};

// Two values' E4M3 codes at their blocks' scales (mx_code, two per conversion) and the codes'
// values times 2^e as a bf16 pair (mx_round's result, rounded to bf16 as mx_round_vector).
__device__ __forceinline__ __nv_fp8x2_storage_t code_pair(float a, float b, float down_a,
                                                          float down_b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(a, down_a), __fmul_rn(b, down_b)),
                                  __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ uint32_t value_pair(__nv_fp8x2_storage_t q, float up_a, float up_b) {
  const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(q, __NV_E4M3)));
  return pack_bf16x2(__fmul_rn(f.x, up_a), __fmul_rn(f.y, up_b));
}

// Max magnitude patterns of a lane's kRows rows of 8 values (4 words each): per column pair
// over the rows (col_max[k]: columns 2k and 2k + 1 in the low and high halves), per row
// (row_max[i / 2]: rows i and i + 1 likewise). The callers then reduce them across lanes.
template <int kRows>
__device__ __forceinline__ void block_maxima(const uint32_t (&x)[kRows][4], uint32_t (&col_max)[4],
                                             uint32_t (&row_max)[kRows / 2]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) col_max[k] = 0;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t mk = magnitudes(x[i][k]);
      col_max[k] = larger_halves(col_max[k], mk);
      m = larger_halves(m, mk);
    }
    m = max(m & 0xFFFFu, m >> 16);
    row_max[i / 2] = i % 2 == 0 ? m : row_max[i / 2] | (m << 16);
  }
}

// The scales of a vector's 8 columns along the rows, from block_maxima's col_max once
// reduced across the block's lanes: col[2k] and col[2k + 1] from col_max[k]'s two halves.
__device__ __forceinline__ void column_scales(const uint32_t (&col_max)[4], BlockScale* col) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    col[2 * k] = BlockScale(col_max[k] & 0xFFFFu);
    col[2 * k + 1] = BlockScale(col_max[k] >> 16);
  }
}

// A vector's 8 values rounded at one scale per value pair position: scales[k] for values 2k
// and 2k + 1 (MXFP8 along K: one block's scale for all; along the rows: each column's).
__device__ __forceinline__ int4 round_vector(const uint32_t (&w)[4], const BlockScale* lo,
                                             const BlockScale* hi, int stride) {
  uint32_t o[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const BlockScale& a = lo[k * stride];
    const BlockScale& b = hi[k * stride];
    o[k] = value_pair(code_pair(bf16_of(w[k], 0), bf16_of(w[k], 1), a.down, b.down), a.up, b.up);
  }
  return make_int4(o[0], o[1], o[2], o[3]);
}

}  // namespace mok
