// Where a row of the schedule lives in a peer's region: the row movers' address arithmetic
// (comm/rows.cu; quant/mx_round_both.cu does the same in 32 bits). A row's slot is its flat index
//   flat = source * max_tokens * topk + token * topk + slot
// (schedule/build_schedule.cu writes it in row_slot).
#pragma once

#include <cstdint>

namespace mok {

// The peer-side row of flat index f in a region of rows of row_bytes: peer f / per_rank, row
// (f mod per_rank) / slots_per_remote_row - the token row for a pull (topk slots share one
// token), the slot row for a push (one per slot).
__device__ __forceinline__ char* peer_row(const int64_t* __restrict__ peer_bases,
                                          int64_t peer_offset, int64_t flat, int64_t per_rank,
                                          int slots_per_remote_row, int64_t row_bytes) {
  const int64_t peer = flat / per_rank;
  return reinterpret_cast<char*>(peer_bases[peer] + peer_offset) +
         (flat - peer * per_rank) / slots_per_remote_row * row_bytes;
}

}  // namespace mok
