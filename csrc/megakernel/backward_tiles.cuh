// The backward megakernel's tiles and the order they are handed out in (one index space,
// increasing, by the grid-wide counter of tile_queue.cuh).
//
// The schedule's m-blocks are walked macrobatch by macrobatch (macrobatch_ring.cuh: with the
// ring on, a macrobatch's rows live in one of `slots` ring slots; off, there is one macrobatch
// holding every m-block at its schedule position). A macrobatch's tiles are runs of
// consecutive indices:
//   round in   (FP8 recipes) per m-block x 2 H / kRoundCols: dY, then x, rounded both ways
//              (mx_round_tile.cuh, fp8_round_tile.cuh)
//   FC1        per m-block x F / tile_cols (only when recomputing): h and act(h) * p from the
//              pulled x rows, the forward's FC1 tile bit for bit (tile_epilogue.cuh)
//   FC2-dgrad  per m-block x F / kDgrad2Cols:  dA = dY W2 (N-major W2; FP8 recipes: K-major
//              W2^T),
//              whose epilogue is the activation backward: dh (gate | up) and a per-row dprob
//              partial
//   round act  (FP8 recipes) per m-block x F / kRoundCols: act rounded along the rows
//   round dh   (FP8 recipes) per m-block x F1 / kRoundCols: dh rounded both ways
//   dW2        per expert part x H / kGemmBlockM x F / kGemmBlockN:  dY^T act over the part's rows
//   FC1-dgrad  per m-block x H / dgrad1 columns (kGemmBlockN; blockwise kFp8BlockN):  dX rows
//              = dh W1 (N-major W1; FP8 recipes: K-major W1^T), each row into its (token, k)
//              slot on the source rank, with its dprob
//   dW1        per expert part x F1 / kGemmBlockM x H / kGemmBlockN:  dh^T x over the part's rows
// An expert part is the expert's rows inside the macrobatch. An expert whose rows cross a
// macrobatch boundary has a part on each side; the weight-gradient tile of its first part
// leaves its fp32 accumulators as a carry (kPartCarryOut) and the next part's tile starts its
// MMAs from them (kPartCarryIn). Parts split at m-block boundaries, which are k-block
// boundaries, so the chain of fp32 MMA accumulations is the one an unsplit tile runs: the
// weight gradients do not depend on the macrobatch size. Experts without rows have one part,
// in the macrobatch where their neighbours are, and their tiles write dW = 0.
// Dependencies point only to lower indices or to the pull: FC1 waits for its m-block's rows,
// FC2-dgrad for its dY rows and FC1 tiles, dW2 for the dY rows and FC1 tiles of its part's
// m-blocks, FC1-dgrad for its m-block's FC2-dgrad tiles, dW1 for those of its part's m-blocks,
// a carried part for the same tile of the part before (an earlier macrobatch); the pull of a
// macrobatch waits for every tile of the macrobatch that held its slot before. Under the FP8
// recipes the GEMM tiles read the rounded forms instead (tile_needs): the round-in tiles wait
// for the m-block's rows, round act for its FC1 tiles, round dh for its FC2-dgrad tiles.
// Blockwise FP8 runs FC1 and the dgrads on the FP8 engine's 128-wide tiles (FC1:
// tile_cols<kAct, kFp8BlockN> columns), the weight gradients on the BF16 tile engine.
#pragma once

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "megakernel/macrobatch_ring.cuh"
#include "megakernel/mx_round_tile.cuh"

namespace mok {

// FC2-dgrad tiles are kDgrad2Cols wide (m64n128 per consumer): the h tile the epilogue needs
// (gate and up, 64 rows x 128 columns each) then fits the consumer's staging buffer, where
// it is prefetched during the mainloop and overwritten in place by dh.
constexpr int kDgrad2Cols = 128;

enum BackwardKind : int {
  kFc1 = 0, kDgrad2 = 1, kWgrad2 = 2, kDgrad1 = 3, kWgrad1 = 4,
  kRoundIn = 5, kRoundAct = 6, kRoundDh = 7,  // FP8 recipes (mx_/fp8_round_tile.cuh)
};

__host__ __device__ constexpr bool is_round_tile(int kind) { return kind >= kRoundIn; }

// Progress a tile waits for, counted per m-block and per macrobatch.
enum BackwardProgress : int {
  kRowsPulled = 0,  // rows pulled (dY, and x when recomputing): counted in rows
  kFc1Stored,       // FC1 tile halves (h, act)
  kDhStored,        // FC2-dgrad tile halves (dh, dprob partials)
  kInRounded,       // FP8 recipes: round-in tile halves (dY and x both ways)
  kActRounded,      // FP8 recipes: round-act tile halves
  kDhRounded,       // FP8 recipes: round-dh tile halves
  kProgressKinds
};

// What the producer of a tile of `kind` waits for before its loads, as a set of
// BackwardProgress bits. Rounding tiles have no loads: their consumers wait themselves
// (round_tile_input). kRounds: an FP8 recipe's launch, with rounding tiles.
template <bool kRounds>
__host__ __device__ constexpr uint32_t tile_needs(int kind, bool recompute) {
  const uint32_t fc1 = recompute ? 1u << kFc1Stored : 0u;
  if constexpr (kRounds) {
    switch (kind) {
      case kFc1: return 1u << kInRounded;
      case kDgrad2: return 1u << kInRounded | fc1;
      case kWgrad2: return 1u << kInRounded | 1u << kActRounded;
      case kDgrad1: return 1u << kDhRounded;
      case kWgrad1: return 1u << kInRounded | 1u << kDhRounded;
      default: return 0u;
    }
  } else {
    switch (kind) {
      case kFc1: return 1u << kRowsPulled;
      case kDgrad2: case kWgrad2: return 1u << kRowsPulled | fc1;
      case kDgrad1: return 1u << kDhStored;
      case kWgrad1: return 1u << kRowsPulled | 1u << kDhStored;
      default: return 0u;
    }
  }
}

// What a rounding tile's consumers wait for (of its own m-block), and what it counts when done.
__host__ __device__ constexpr int round_tile_input(int kind) {
  return kind == kRoundIn ? kRowsPulled : kind == kRoundAct ? kFc1Stored : kDhStored;
}
__host__ __device__ constexpr int round_tile_output(int kind) {
  return kind == kRoundIn ? kInRounded : kind == kRoundAct ? kActRounded : kDhRounded;
}

// A weight-gradient part's place in its expert's chain of parts.
constexpr int kPartCarryIn = 1;   // rows of the expert came before: start from the carry
constexpr int kPartCarryOut = 2;  // rows of the expert follow: leave the sums as a carry

// A tile as the producer decoded it (tile_queue.cuh entry).
struct BackwardTile {
  int tile, kind, expert;
  int block;    // FC1 / dgrad: the schedule's m-block; wgrad: the gradient's M-block
  int n_block;
  int row0;     // first row in the launch's row buffers (its ring slot's, or the schedule's)
  int srow0;    // first schedule row (row_slot, row_prob)
  int rows;     // FC1 / dgrad: the expert's rows from srow0 on; wgrad: the part's rows (its K)
  int macro;    // macrobatch
  int part;     // wgrad: kPartCarryIn | kPartCarryOut
};

struct BackwardOrder {
  int nb_fc1;                  // FC1 n-blocks per m-block: F / tile_cols; 0 without recompute
  int nb_dgrad2, nb_dgrad1;    // n-blocks per m-block: F / kDgrad2Cols, H / dgrad1 columns
  int mb_wgrad2, nb_wgrad2;    // per expert: H / kGemmBlockM, F / kGemmBlockN
  int mb_wgrad1, nb_wgrad1;    // per expert: F1 / kGemmBlockM, H / kGemmBlockN
  // Rounding tiles per m-block under an FP8 recipe (0 under BF16): H / kRoundCols of dY then
  // as many of x (nb_round_h each), F / kRoundCols of act, F1 / kRoundCols of dh.
  int nb_round_h, nb_round_act, nb_round_dh;

  // fc1_cols: FC1's output columns per tile (0: no FC1 tiles); rounds: rounding tiles;
  // dgrad1_cols: FC1-dgrad's tile width.
  __host__ __device__ static BackwardOrder make(int hidden, int ffn, int f1, int fc1_cols,
                                                bool rounds, int dgrad1_cols) {
    auto up = [](int a, int b) { return (a + b - 1) / b; };
    return {fc1_cols > 0 ? up(ffn, fc1_cols) : 0, up(ffn, kDgrad2Cols), up(hidden, dgrad1_cols),
            up(hidden, kGemmBlockM), up(ffn, kGemmBlockN), up(f1, kGemmBlockM),
            up(hidden, kGemmBlockN), rounds ? up(hidden, kRoundCols) : 0,
            rounds ? up(ffn, kRoundCols) : 0, rounds ? up(f1, kRoundCols) : 0};
  }
  __host__ __device__ int nb_round_in() const { return 2 * nb_round_h; }
  __host__ __device__ int wgrad2_tiles() const { return mb_wgrad2 * nb_wgrad2; }
  __host__ __device__ int wgrad1_tiles() const { return mb_wgrad1 * nb_wgrad1; }
  // Weight-gradient tiles of one expert part: the carry's tiles (wgrad.cuh).
  __host__ __device__ int wgrad_tiles() const { return wgrad2_tiles() + wgrad1_tiles(); }
  __host__ __device__ int macro_tiles(int mblocks, int experts) const {
    return mblocks * (nb_round_in() + nb_fc1 + nb_dgrad2 + nb_round_act + nb_round_dh +
                      nb_dgrad1) +
           experts * wgrad_tiles();
  }
  // The tile's place among its expert part's weight-gradient tiles.
  __device__ int wgrad_index(const BackwardTile& w) const {
    return w.kind == kWgrad2 ? w.block * nb_wgrad2 + w.n_block
                             : wgrad2_tiles() + w.block * nb_wgrad1 + w.n_block;
  }
};

// Per macrobatch: its first tile index and first schedule row (entry n: the ends), and the
// experts whose parts it holds, [expert_begin, expert_end). The producer decodes a tile with
// a few shared-memory reads and no search over the experts (its path is serial per tile).
struct MacroTable {
  int32_t tile_begin[kMaxMacrobatches + 1];
  int32_t row_begin[kMaxMacrobatches + 1];
  int32_t expert_begin[kMaxMacrobatches];
  int32_t expert_end[kMaxMacrobatches];
};

// One warp fills the table (after build_mblock_table). A macrobatch's experts run from the one
// owning its first m-block (which has a part in the macrobatch before too where its rows
// began there) to the one owning its last; experts without rows go with the macrobatch of the
// next expert that has rows (the last macrobatch takes the trailing ones).
__device__ __forceinline__ void build_macro_table(MacroTable& mt, const MacrobatchRing& ring,
                                                  const sm90::MBlockTable& table,
                                                  const BackwardOrder& order) {
  const int lane = threadIdx.x % 32;
  int carry = 0;
  for (int base = 0; base < ring.n_macro; base += 32) {
    const int j = base + lane;
    int tiles = 0;
    if (j < ring.n_macro) {
      const int m0 = j * ring.per_macro, mblocks = ring.mblocks_in(j);
      int first = 0, end = table.num_experts;
      if (j > 0) {
        const int before = table.expert_of_mblock(m0 - 1);
        first = table.mblock_begin[before + 1] > m0 ? before : before + 1;
      }
      if (j < ring.n_macro - 1) end = table.expert_of_mblock(m0 + mblocks - 1) + 1;
      mt.expert_begin[j] = first;
      mt.expert_end[j] = end;
      mt.row_begin[j] = macro_first_row(ring, table, j);
      tiles = order.macro_tiles(mblocks, end - first);
    }
    int incl = tiles;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    if (j < ring.n_macro) mt.tile_begin[j] = carry + incl - tiles;
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) {
    mt.tile_begin[ring.n_macro] = carry;
    mt.row_begin[ring.n_macro] = table.row_begin[table.num_experts];
  }
}

__device__ __forceinline__ BackwardTile backward_tile_at(const BackwardOrder& o,
                                                         const MacrobatchRing& ring,
                                                         const sm90::MBlockTable& table,
                                                         const MacroTable& mt, int t) {
  const int j = sm90::expert_at(mt.tile_begin, ring.n_macro, t);
  int local = t - mt.tile_begin[j];
  const int m0 = j * ring.per_macro, m1 = m0 + ring.mblocks_in(j);
  const int e0 = mt.expert_begin[j], experts = mt.expert_end[j] - e0;
  auto slot_row = [&](int mblock, int srow) {
    return ring.on ? static_cast<int>(ring.slot_row0(mblock)) : srow;
  };
  auto per_mblock = [&](int kind, int nb) {
    const PhaseTile pt = grouped_tile(table, false, m0, m1, nb, local);
    const int srow0 = table.first_row(pt.mblock, pt.expert);
    return BackwardTile{t, kind, pt.expert, pt.mblock, pt.n_block, slot_row(pt.mblock, srow0),
                        srow0, table.row_begin[pt.expert + 1] - srow0, j, 0};
  };
  auto per_part = [&](int kind, int mb, int nb) {
    const int per_expert = mb * nb;
    const int e = e0 + local / per_expert, in_expert = local % per_expert;
    const int begin = table.row_begin[e], end = table.row_begin[e + 1];
    const int p0 = max(begin, mt.row_begin[j]);
    const int p1 = min(end, mt.row_begin[j + 1]);
    int row0 = 0, part = 0;
    if (p1 > p0) {  // a part starts an m-block: the expert's first, or the macrobatch's
      row0 = slot_row(table.mblock_of_row(p0, e), p0);
      part = (begin < p0 ? kPartCarryIn : 0) | (end > p1 ? kPartCarryOut : 0);
    }
    return BackwardTile{t, kind, e, in_expert / nb, in_expert % nb, row0, p0, max(0, p1 - p0),
                        j, part};
  };
  const int mblocks = m1 - m0;
  if (local < mblocks * o.nb_round_in()) return per_mblock(kRoundIn, o.nb_round_in());
  local -= mblocks * o.nb_round_in();
  if (local < mblocks * o.nb_fc1) return per_mblock(kFc1, o.nb_fc1);
  local -= mblocks * o.nb_fc1;
  if (local < mblocks * o.nb_dgrad2) return per_mblock(kDgrad2, o.nb_dgrad2);
  local -= mblocks * o.nb_dgrad2;
  if (local < mblocks * o.nb_round_act) return per_mblock(kRoundAct, o.nb_round_act);
  local -= mblocks * o.nb_round_act;
  if (local < mblocks * o.nb_round_dh) return per_mblock(kRoundDh, o.nb_round_dh);
  local -= mblocks * o.nb_round_dh;
  if (local < experts * o.wgrad2_tiles()) return per_part(kWgrad2, o.mb_wgrad2, o.nb_wgrad2);
  local -= experts * o.wgrad2_tiles();
  if (local < mblocks * o.nb_dgrad1) return per_mblock(kDgrad1, o.nb_dgrad1);
  local -= mblocks * o.nb_dgrad1;
  return per_part(kWgrad1, o.mb_wgrad1, o.nb_wgrad1);
}

}  // namespace mok
