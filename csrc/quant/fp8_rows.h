// An FP8 engine's A operand in global memory (gemm/sm90/fp8_mainloop.cuh reads it through
// fp8_row_tile_map and fp8_row_scales_map; the quantizers and the megakernels write it): E4M3
// codes, rows of code_stride bytes, and each row's E8M0 scale codes transposed, [block][row]
// with row stride scale_stride (ops.fp8_quantize_rows' layout).
#pragma once

#include <cstdint>

namespace mok {

struct Fp8Rows {
  uint8_t* codes;
  int64_t code_stride;
  uint8_t* scales;
  int64_t scale_stride;
};

}  // namespace mok
