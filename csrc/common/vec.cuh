// 16-byte vectors: the unit of every global-memory access on the row paths.
#pragma once

#include <cuda_bf16.h>

namespace mok {

// 8 bf16 values = one 16-byte vector.
union Bf16x8 {
  int4 raw;
  __nv_bfloat16 v[8];
};

}  // namespace mok
