// Host-side checks both megakernels' launchers make of the MoE call they are given: the
// expert weights, the schedule's offsets, the row width the row-pulling ring can hold, the
// minibatch, the EP group size, a blockwise FP8 operand buffer; and the m-block bound their
// counters are sized by.
#pragma once

#include <torch/extension.h>

#include <algorithm>

#include "common/error.cuh"
#include "config/kernel_config.cuh"
#include "megakernel/row_pull.cuh"
#include "quant/fp8_rows.h"

namespace mok {

// Most m-blocks a schedule of `rows` rows over E experts can have (each expert's last one
// partial); mirrored by mok_megatron/cuda/ops.py _max_mblocks.
inline int64_t max_schedule_mblocks(int64_t rows, int64_t experts) {
  return rows / kGemmBlockM + experts + 1;
}

// A megakernel's macrobatch ring over a schedule of at most `max_mblocks` m-blocks
// (megakernel/macrobatch_ring.cuh; ring_mblocks 0: no ring, one macrobatch of every row):
// how many macrobatches it can walk and how many rows its row buffers hold (`cap`, every
// schedule row, without a ring). Mirrored by ops.py macrobatches / macrobatch_ring_rows.
struct RingSize {
  int64_t macrobatches, buffer_rows;
  static RingSize of(int64_t cap, int64_t max_mblocks, int64_t ring_mblocks,
                     int64_t ring_slots) {
    if (ring_mblocks <= 0) return {1, cap};
    return {(max_mblocks + ring_mblocks - 1) / ring_mblocks,
            std::min(ring_slots * ring_mblocks, max_mblocks) * kGemmBlockM};
  }
};

// `who` names the launcher in every message. W1 [E, F1, H], W2 [E, H, F] (F1 = 2F gated).
inline void check_megakernel_call(const char* who, const at::Tensor& w1, const at::Tensor& w2,
                                  const at::Tensor& offsets, const at::Tensor& peer_bases,
                                  int64_t hidden, int64_t f1, int64_t minibatch_rows) {
  const int64_t E = w1.size(0), F = w2.size(2);
  MOK_HOST_CHECK(w1.dim() == 3 && w2.dim() == 3 && w1.size(1) == f1 && w1.size(2) == hidden &&
                     w2.size(0) == E && w2.size(1) == hidden,
                 who, ": W1 must be [E, ", f1, ", ", hidden, "], W2 [E, ", hidden, ", F]");
  MOK_HOST_CHECK(E >= 1 && E <= kGemmMaxExperts, who, ": 1..", kGemmMaxExperts,
                 " local experts, got ", E);
  MOK_HOST_CHECK(offsets.numel() == E + 1 && offsets.scalar_type() == at::kInt, who,
                 ": offsets must be int32 [E + 1]");
  MOK_HOST_CHECK(hidden % 8 == 0 && F % 8 == 0, who, ": H and F must be multiples of 8");
  MOK_HOST_CHECK(pull_slots(static_cast<int>(2 * hidden)) >= kPullMinSlots, who, ": H = ", hidden,
                 " rows are too wide for the row-pulling ring (at most ",
                 kPullBytes / (2 * kPullMinSlots), ")");
  MOK_HOST_CHECK(minibatch_rows >= 1 && minibatch_rows <= (int64_t(1) << 30), who,
                 ": minibatch_rows must be >= 1, got ", minibatch_rows);
  MOK_HOST_CHECK(w1.stride(2) == 1 && w2.stride(2) == 1 && w1.stride(0) > 0 && w2.stride(0) > 0,
                 who, ": weights need contiguous rows and positive strides");
  MOK_HOST_CHECK(peer_bases.numel() >= 1 && peer_bases.numel() <= kMaxRanks, who, ": 1..",
                 kMaxRanks, " ranks, got ", peer_bases.numel());
}

// A blockwise FP8 operand buffer as the FP8 engine reads it (ops.py megakernel_fp8_rows):
// codes [>= rows, cols] in 16-byte aligned rows (cols padded to 16), scale codes
// [ceil(cols / 128), >= the codes' rows] with rows padded to 16. `who` names the launcher,
// `name` the buffer.
inline Fp8Rows fp8_rows_of(const char* who, const char* name, const at::Tensor& codes,
                           const at::Tensor& scales, int64_t rows, int64_t cols) {
  MOK_HOST_CHECK(codes.is_cuda() && codes.scalar_type() == at::kFloat8_e4m3fn &&
                     codes.dim() == 2 && codes.size(0) >= rows && codes.size(1) == cols &&
                     codes.stride(1) == 1 && codes.stride(0) % 16 == 0 &&
                     codes.stride(0) >= (cols + 15) / 16 * 16 &&
                     reinterpret_cast<uintptr_t>(codes.data_ptr()) % 16 == 0,
                 who, ": ", name, " must be float8_e4m3fn codes [>= ", rows, ", ", cols,
                 "] in 16-byte aligned rows, got ", codes.sizes());
  const int64_t blocks = (cols + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  MOK_HOST_CHECK(scales.device() == codes.device() && scales.scalar_type() == at::kByte &&
                     scales.dim() == 2 && scales.size(0) == blocks &&
                     scales.size(1) >= codes.size(0) && scales.stride(1) == 1 &&
                     scales.stride(0) % 16 == 0,
                 who, ": ", name, "'s scales must be uint8 [", blocks, ", >= ", codes.size(0),
                 "] with rows padded to 16, got ", scales.sizes());
  return Fp8Rows{reinterpret_cast<uint8_t*>(codes.data_ptr()), codes.stride(0),
                 scales.data_ptr<uint8_t>(), scales.stride(0)};
}

}  // namespace mok
