// The backward megakernel's dgrad epilogues, each run by a consumer warpgroup on its 64 rows.
//
// FC2-dgrad (dA = dY W2, kDgrad2Cols columns): the activation backward with the router prob,
//   dA' = bf16(dA), g, u = h (bf16, as forward kept it), a = act(g) (x u when gated),
//   dgate = bf16(dA' p u act'(g)) (gated) or bf16(dA' p act'(g)),   dup = bf16(dA' p act(g)),
//   dprob partial = sum over the tile's columns of dA' a, in fp32,
// the formulas and rounding points of the separate path (epilogue/activation.cu). A row's
// partial sums its tile's columns in the order the MMA layout gave each lane of a quad (8-column
// chunk j, then the two columns), then the quad's four in a fixed butterfly; the partials
// (one per FC2-dgrad tile) are summed in n-block order by the FC1-dgrad tile of n-block 0 of
// its m-block, which pushes the sum to the row's (token, k) slot value.
//
// FC1-dgrad (dX rows = dh W1): each row straight to its (token, k) combine slot on the
// source rank as one bulk store, as forward's FC2 rows go.
// Both run on the storer warps (megakernel/backward_storer.cuh).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/vec.cuh"
#include "epilogue/activation_math.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/sm90/tma.cuh"
#include "megakernel/backward_tiles.cuh"

namespace mok {

// One element of FC2-dgrad's activation backward: dA' = bf16(dA) (da), g and u from h (u 0
// when not gated), p the row's prob; dgate and dup as above (before their bf16 rounding), and
// the element's dprob term added to dp.
template <int kAct>
__device__ __forceinline__ void dgrad_element(float da, float g, float u, float p, float& dgate,
                                              float& dup, float& dp) {
  const ActValue av = act_eval<kAct>(g);
  const float dact = da * p;
  if constexpr (sm90::gated_epilogue<kAct>()) {
    dgate = dact * u * av.df;
    dup = dact * av.f;
    dp += da * (av.f * u);
  } else {
    dgate = dact * av.df;
    dup = 0.f;
    dp += da * av.f;
  }
}

// Where a schedule row's results go on its source rank: the (token, k) slot of flat index
// `flat` in the region at `offset` of that rank's workspace, `bytes_per_slot` apart.
__device__ __forceinline__ char* source_slot(const int64_t* peer_bases, int per_rank, int flat,
                                             int64_t offset, int64_t bytes_per_slot) {
  const int peer = flat / per_rank;
  return reinterpret_cast<char*>(peer_bases[peer] + offset) +
         int64_t(flat - peer * per_rank) * bytes_per_slot;
}

}  // namespace mok
