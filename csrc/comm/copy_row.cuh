// One warp copies one row (local or peer memory over NVLink) with 16-byte vectors.
#pragma once

#include "config/kernel_config.cuh"

namespace mok {

// One warp copies one row of `vecs` 16-byte vectors, several loads in flight per lane.
__device__ __forceinline__ void copy_row(int4* __restrict__ dst, const int4* __restrict__ src,
                                         int vecs, int lane) {
  int v = lane;
  for (; v + 32 * (kRowVecsInFlight - 1) < vecs; v += 32 * kRowVecsInFlight) {
    int4 buf[kRowVecsInFlight];
#pragma unroll
    for (int j = 0; j < kRowVecsInFlight; ++j) buf[j] = src[v + 32 * j];
#pragma unroll
    for (int j = 0; j < kRowVecsInFlight; ++j) dst[v + 32 * j] = buf[j];
  }
  for (; v < vecs; v += 32) dst[v] = src[v];
}

}  // namespace mok
