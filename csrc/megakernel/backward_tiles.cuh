// The backward megakernel's tiles and the order they are handed out in (one index space,
// increasing, by the grid-wide counter of tile_queue.cuh).
//
// Four kinds, each a run of consecutive indices:
//   FC2-dgrad  per m-block of the schedule x F / kDgrad2Cols:  dA = dY W2 (N-major W2), whose
//              epilogue is the activation backward: dh (gate | up) and a per-row dprob partial
//   dW2        per expert x H / kGemmBlockM x F / kGemmBlockN:  dW2[e] = dY^T act, K = the
//              expert's rows
//   FC1-dgrad  per m-block x H / kGemmBlockN:  dX rows = dh W1 (N-major W1), each row into its
//              (token, k) slot on the source rank, with its dprob
//   dW1        per expert x F1 / kGemmBlockM x H / kGemmBlockN:  dW1[e] = dh^T x
// Dependencies point only to lower indices or to the pull (which depends on nothing): an
// FC2-dgrad tile waits for its m-block's dY rows, a dW2 tile for all of its expert's, an
// FC1-dgrad tile for the FC2-dgrad tiles of its m-block, a dW1 tile for those of every m-block
// of its expert. The dgrad phases take an expert's m-blocks in groups, n-block by n-block, as
// forward does (macrobatch_ring.cuh: grouped_tile), so tiles reading one weight slab run
// together; dW2 sits between the dgrad phases so the FC1-dgrad tiles find their dh done.
#pragma once

#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "megakernel/macrobatch_ring.cuh"

namespace mok {

// FC2-dgrad tiles are kDgrad2Cols wide (m64n128 per consumer): the h tile the epilogue needs
// (gate and up, 64 rows x 128 columns each) then fits the consumer's staging buffer, where
// it is prefetched during the mainloop and overwritten in place by dh.
constexpr int kDgrad2Cols = 128;

enum BackwardKind : int { kDgrad2 = 0, kWgrad2 = 1, kDgrad1 = 2, kWgrad1 = 3 };

// A tile as the producer decoded it (tile_queue.cuh entry). Dgrad tiles: `block` is the
// schedule's m-block, row0 its first row, rows the expert's rows from row0 on. Wgrad tiles:
// `block` is the M-block of the weight gradient (H for dW2, F1 for dW1), row0 the expert's
// first schedule row and rows its row count (the reduction).
struct BackwardTile {
  int tile, kind, expert, block, n_block, row0, rows;
};

struct BackwardOrder {
  int mblocks;                 // schedule m-blocks
  int experts;
  int nb_dgrad2, nb_dgrad1;    // n-blocks per m-block: F / kDgrad2Cols, H / kGemmBlockN
  int mb_wgrad2, nb_wgrad2;    // per expert: H / kGemmBlockM, F / kGemmBlockN
  int mb_wgrad1, nb_wgrad1;    // per expert: F1 / kGemmBlockM, H / kGemmBlockN

  __device__ static BackwardOrder make(int mblocks, int experts, int hidden, int ffn, int f1) {
    auto up = [](int a, int b) { return (a + b - 1) / b; };
    return {mblocks, experts, up(ffn, kDgrad2Cols), up(hidden, kGemmBlockN),
            up(hidden, kGemmBlockM), up(ffn, kGemmBlockN), up(f1, kGemmBlockM),
            up(hidden, kGemmBlockN)};
  }
  __device__ int dgrad2_end() const { return mblocks * nb_dgrad2; }
  __device__ int wgrad2_end() const { return dgrad2_end() + experts * mb_wgrad2 * nb_wgrad2; }
  __device__ int dgrad1_end() const { return wgrad2_end() + mblocks * nb_dgrad1; }
  __device__ int end() const { return dgrad1_end() + experts * mb_wgrad1 * nb_wgrad1; }
};

__device__ __forceinline__ BackwardTile backward_tile_at(const BackwardOrder& o,
                                                         const sm90::MBlockTable& table,
                                                         int t) {
  auto dgrad = [&](int kind, int local, int nb) {
    const PhaseTile pt = grouped_tile(table, false, 0, o.mblocks, nb, local);
    const int row0 = table.first_row(pt.mblock, pt.expert);
    return BackwardTile{t, kind, pt.expert, pt.mblock, pt.n_block, row0,
                        table.row_begin[pt.expert + 1] - row0};
  };
  auto wgrad = [&](int kind, int local, int mb, int nb) {
    const int per_expert = mb * nb;
    const int e = local / per_expert, in_expert = local - e * per_expert;
    const int row0 = table.row_begin[e];
    return BackwardTile{t, kind, e, in_expert / nb, in_expert % nb, row0,
                        table.row_begin[e + 1] - row0};
  };
  if (t < o.dgrad2_end()) return dgrad(kDgrad2, t, o.nb_dgrad2);
  if (t < o.wgrad2_end()) return wgrad(kWgrad2, t - o.dgrad2_end(), o.mb_wgrad2, o.nb_wgrad2);
  if (t < o.dgrad1_end()) return dgrad(kDgrad1, t - o.wgrad2_end(), o.nb_dgrad1);
  return wgrad(kWgrad1, t - o.dgrad1_end(), o.mb_wgrad1, o.nb_wgrad1);
}

}  // namespace mok
