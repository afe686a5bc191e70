// Host side of TMA: tensor maps (CUtensorMap) for bf16 operands with 128-byte swizzle.
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>

namespace mok::sm90 {

// A bf16 tensor of `dims` (innermost first) with byte `strides` for dims 1.. (dim 0 is
// contiguous), read in boxes of `box` elements; out-of-bounds elements read as zero.
// The innermost box extent must be 64 (one 128-byte swizzle row).
CUtensorMap make_bf16_tensor_map_4d(const void* base, const std::array<uint64_t, 4>& dims,
                                    const std::array<uint64_t, 3>& strides_bytes,
                                    const std::array<uint32_t, 4>& box);

}  // namespace mok::sm90
