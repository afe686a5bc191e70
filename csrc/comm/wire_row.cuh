// The FP8 wire row (mok_megatron/cuda/ops.py Fp8WireRow): a token row as a rank publishes it under
// an FP8 recipe (quant/mx_round.cu, quantize_wire_rows) - its E4M3 codes in the first
// code_bytes (padded to 16), then one E8M0 scale code per `block` codes of the row. Pulled as
// it is, one byte per element crosses NVLink; dequantized, each code times its block's scale
// is exactly a bf16 value (quant/mx_format.cuh), bit for bit mx_round_columns of the row.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/error.cuh"
#include "quant/mx_format.cuh"

namespace mok {

struct WireRow {
  int row_bytes;   // 0: no wire, rows move as bf16
  int code_bytes;
  int block;       // codes per scale code, a multiple of 16
};

// `what` names the caller in the message.
inline void check_wire_row(const char* what, int64_t row_bytes, int64_t code_bytes, int64_t block,
                           int64_t cols) {
  MOK_HOST_CHECK(block > 0 && block % 16 == 0 && code_bytes >= cols && code_bytes % 16 == 0 &&
                     row_bytes % 16 == 0 && row_bytes >= code_bytes + (cols + block - 1) / block,
                 what, ": wire rows of ", row_bytes, " bytes (codes ", code_bytes, ", a scale "
                 "code per ", block, ") do not hold ", cols, " codes");
}

// 16 codes (one 16-byte vector of a wire row) times `factor` as 16 bf16 values at dst (8 of
// them when the row's last vector holds only 8 columns: cols % 16 == 8).
__device__ __forceinline__ void store_dequantized_codes(__nv_bfloat16* dst, const int4& codes,
                                                        float factor, bool second_half) {
  const uint32_t* four = reinterpret_cast<const uint32_t*>(&codes);
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = dequantize_pair(four[i], factor);
    o[2 * i + 1] = dequantize_pair(four[i] >> 16, factor);
  }
  int4* out = reinterpret_cast<int4*>(dst);
  out[0] = make_int4(o[0], o[1], o[2], o[3]);
  if (second_half) out[1] = make_int4(o[4], o[5], o[6], o[7]);
}

}  // namespace mok
