// The backward megakernel's dgrad epilogues, each run by a consumer warpgroup on its 64 rows.
//
// FC2-dgrad (dA = dY W2, kDgrad2Cols columns): the activation backward with the router prob,
//   dA' = bf16(dA), g, u = h (bf16, as forward kept it), a = act(g) (x u when gated),
//   dgate = bf16(dA' p u act'(g)) (gated) or bf16(dA' p act'(g)),   dup = bf16(dA' p act(g)),
//   dprob partial = sum over the tile's columns of dA' a, in fp32,
// the formulas and rounding points of the separate path (epilogue/activation.cu). The tile's h
// (gate and up) is prefetched by TMA into the warpgroup's staging buffer while its mainloop
// runs; each thread reads its accumulator positions' h there and writes dh over it, and the
// buffer leaves as dh by TMA (an expert's partial last block: copied out). A row's dprob
// partials (one per FC2-dgrad tile) are summed in n-block order by the FC1-dgrad tile of
// n-block 0 of its m-block, which pushes the sum to the row's (token, k) slot value.
//
// FC1-dgrad (dX rows = dh W1): each row straight to its (token, k) combine slot on the
// source rank as one bulk store, as forward's FC2 rows go (epilogue_storer.cuh).
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

// One half (gate or up) of the FC2-dgrad tile's h in the staging buffer: 64 rows x
// kDgrad2Cols columns as two swizzled 64-column boxes (write_staged's layout).
constexpr int kHHalfBytes = kDgrad2Cols / 64 * sm90::kStagedBoxBytes;
static_assert(2 * kHHalfBytes <= sm90::kStagedBufBytes, "h's gate and up fit the buffer");

// Leader: TMA loads of h for rows row0 .. row0 + 63, columns col0 .. col0 + kDgrad2Cols - 1 of
// each half, completing on `bar` (columns past F read as zero).
template <bool kGated>
__device__ __forceinline__ void prefetch_h_tile(uint8_t* buf, const CUtensorMap* h_map,
                                                uint64_t* bar, int row0, int col0) {
  constexpr int kHalves = kGated ? 2 : 1;
  sm90::mbar_arrive_expect_tx(bar, kHalves * kHHalfBytes);
  for (int half = 0; half < kHalves; ++half) {
    for (int box = 0; box < kDgrad2Cols / 64; ++box) {
      sm90::tma_load_4d(buf + half * kHHalfBytes + box * sm90::kStagedBoxBytes, h_map, bar,
                        col0 + 64 * box, half, row0, 0);
    }
  }
}

// dh over h in place and this thread's two rows' dprob partials (rows 16 warp + lane / 4 +
// 8 i), from the m64n128 accumulators (the first kDgrad2Cols / 2 of d). p: the rows' probs.
template <int kAct, int kRegs>
__device__ __forceinline__ void activation_backward_staged(const float (&d)[kRegs], uint8_t* buf,
                                                           int t, const float (&p)[2],
                                                           float (&dp)[2]) {
  static_assert(kRegs >= kDgrad2Cols / 2, "the tile's accumulators");
  constexpr bool kGated = sm90::gated_epilogue<kAct>();
  const int warp = t / 32, lane = t % 32;
  const int r0 = 16 * warp + lane / 4;
  uint8_t* row_base = buf + r0 * 128 + (lane % 4) * 4;
  dp[0] = dp[1] = 0.f;
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    uint8_t* base = row_base + ((jj ^ (r0 % 8)) * 16);
#pragma unroll
    for (int box = 0; box < kDgrad2Cols / 64; ++box) {
      const int j = 8 * box + jj;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t* gp = reinterpret_cast<uint32_t*>(base + box * sm90::kStagedBoxBytes +
                                                   i * 8 * 128);
        uint32_t* up = reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(gp) + kHHalfBytes);
        const uint32_t g = *gp;
        const uint32_t u = kGated ? *up : 0u;
        float dgate[2], dup[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float da = sm90::round_bf16(d[4 * j + 2 * i + c]);
          const ActValue av = act_eval<kAct>(bf16_of(g, c));
          const float dact = da * p[i];
          if constexpr (kGated) {
            const float uv = bf16_of(u, c);
            dgate[c] = dact * uv * av.df;
            dup[c] = dact * av.f;
            dp[i] += da * (av.f * uv);
          } else {
            dgate[c] = dact * av.df;
            dup[c] = 0.f;
            dp[i] += da * av.f;
          }
        }
        *gp = pack_bf16x2(dgate[0], dgate[1]);
        if constexpr (kGated) *up = pack_bf16x2(dup[0], dup[1]);
      }
    }
  }
  // The quad's four lanes hold the same two rows: a fixed butterfly, the same order each run.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    dp[i] += __shfl_xor_sync(0xffffffffu, dp[i], 1);
    dp[i] += __shfl_xor_sync(0xffffffffu, dp[i], 2);
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
