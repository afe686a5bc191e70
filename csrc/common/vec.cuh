// 16-byte vectors (the unit of every global-memory access on the row paths) and bf16 pairs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace mok {

// 8 bf16 values = one 16-byte vector.
union Bf16x8 {
  int4 raw;
  __nv_bfloat16 v[8];
};

// Element i (0: low half) of a bf16 pair, exactly, as fp32; and a pair rounded to bf16.
__device__ __forceinline__ float bf16_of(uint32_t pair, int i) {
  return __uint_as_float(i == 0 ? pair << 16 : pair & 0xffff0000u);
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}

}  // namespace mok
