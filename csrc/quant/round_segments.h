// mx_round_segments (quant/mx_round.cu) with the blockwise recipe's 128-row blocks, run on the
// both-forms pass's units (quant/mx_round_both.cu): x [rows, cols] and out checked by the
// caller; segments as mx_round_segments takes them (offsets, or segment_rows when null).
#pragma once

#include <torch/extension.h>

#include <cstdint>

namespace mok {

void fp8_round_segments(const at::Tensor& x, const int32_t* offsets, int64_t segments,
                        int64_t segment_rows, at::Tensor& out);

}  // namespace mok
