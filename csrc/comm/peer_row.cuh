// Where a row of the schedule lives in a peer's region, for every kernel that reads or writes
// rows by their slots (comm/rows.cu, quant/mx_round_both.cu). A row's slot is its flat index
//   flat = source * max_tokens * topk + token * topk + slot
// (schedule/build_schedule.cu writes it in row_slot).
#pragma once

#include <cstdint>

namespace mok {

// Index: the type of the slot arithmetic, given by the caller (a non-deduced parameter, so
// mixed argument types convert to it). The row movers move a row per warp and keep 64 bits;
// quant/mx_round_both.cu finds 8 rows per lane, where 64-bit divisions were most of its
// integer work, and uses 32 (a slot is an int32).
template <class T>
struct SlotIndex {
  using type = T;
};

// The peer-side row of flat index f in a region of rows of row_bytes: peer f / per_rank, row
// (f mod per_rank) / slots_per_remote_row - the token row for a pull (topk slots share one
// token), the slot row for a push (one per slot).
template <class Index = int64_t>
__device__ __forceinline__ char* peer_row(const int64_t* __restrict__ peer_bases,
                                          int64_t peer_offset,
                                          typename SlotIndex<Index>::type flat,
                                          typename SlotIndex<Index>::type per_rank,
                                          typename SlotIndex<Index>::type slots_per_remote_row,
                                          int64_t row_bytes) {
  const Index peer = flat / per_rank;
  return reinterpret_cast<char*>(peer_bases[peer] + peer_offset) +
         (flat - peer * per_rank) / slots_per_remote_row * row_bytes;
}

}  // namespace mok
