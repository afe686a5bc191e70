// The forward megakernel's macrobatch ring: where pulled token rows and FC1's activations live,
// and the order in which tiles run, so that their memory is bounded whatever the routing.
//
// The schedule's m-blocks (kGemmBlockM rows of one expert) are grouped into macrobatches of
// `per_macro` consecutive m-blocks. With the ring on, rows and act hold `slots` macrobatches:
// m-block j sits at ring slot (j / per_macro) % slots, padded to kGemmBlockM rows, so a
// partial m-block never shares rows with the next one. A macrobatch's slot is reused once
// every FC2 tile of the macrobatch `slots` earlier has read its act rows (fc2_done); the
// row-pulling blocks wait for that before storing into it.
//
// Tile order (one index space, handed out in increasing order): FC1 of macrobatch 0, then for
// k = 1 .. n-1 FC1 of k followed by FC2 of k - 1, then FC2 of n - 1. Every tile depends only on
// lower indices: FC2(k) on FC1(k), FC1(k) on the pull of k, which waits for FC2(k - slots) -
// lower as long as slots > 1 (FC2 lags FC1 by one macrobatch). Without the ring there is one
// macrobatch (all FC1 tiles, then all FC2 tiles) and rows keep their schedule positions.
// Inside a phase (FC1 or FC2 of one macrobatch) each expert's m-blocks are taken in groups
// of up to kTileGroupMBlocks, n-block by n-block, so the tiles that read the same weight slab
// have adjacent indices: handed out dynamically, they start together and the slab comes
// from HBM once, the others reading it from L2 (docs/perf-log.md: grouped tile order).
#pragma once

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_engine.cuh"

namespace mok {

struct MacrobatchRing {
  bool on;
  int per_macro;  // m-blocks per macrobatch (all of them when off)
  int slots;      // macrobatches resident at once (ring on)
  int mblocks;    // m-blocks of the whole schedule
  int n_macro;    // macrobatches (>= 1)

  // ring_mblocks > 0: the ring's macrobatch size in m-blocks; 0: no ring.
  __device__ static MacrobatchRing make(int ring_mblocks, int slots, int mblocks) {
    const bool on = ring_mblocks > 0;
    const int per_macro = on ? ring_mblocks : (mblocks > 0 ? mblocks : 1);
    const int n = mblocks > 0 ? (mblocks + per_macro - 1) / per_macro : 1;
    return {on, per_macro, slots, mblocks, n};
  }
  __device__ int macro_of(int mblock) const { return mblock / per_macro; }
  __device__ int mblocks_in(int macro) const {
    return macro < n_macro - 1 ? per_macro : mblocks - (n_macro - 1) * per_macro;
  }
  // First row of m-block j in rows / act with the ring on.
  __device__ int64_t slot_row0(int mblock) const {
    return (int64_t((mblock / per_macro) % slots) * per_macro + mblock % per_macro) *
           kGemmBlockM;
  }
};

// First schedule row of macrobatch k (the schedule's total for k >= the last).
__device__ __forceinline__ int macro_first_row(const MacrobatchRing& r,
                                               const sm90::MBlockTable& table, int k) {
  const int mblock = k * r.per_macro;
  if (mblock >= r.mblocks) return table.row_begin[table.num_experts];
  return table.first_row(mblock, table.expert_of_mblock(mblock));
}

struct PhaseTile {
  bool fc1;
  int mblock;   // global m-block index
  int n_block;
  int expert;
};

// Tile `local` of one phase over m-blocks [m0, m1), nb tiles per m-block. An expert's tiles
// fill the same index range as in plain (m-block, n-block) order, so the m-block that plain
// order would give names the expert; inside it, the expert's part of the phase in groups of
// kTileGroupMBlocks m-blocks (sm90::group_order).
__device__ __forceinline__ PhaseTile grouped_tile(const sm90::MBlockTable& table, bool fc1,
                                                  int m0, int m1, int nb, int local) {
  const int e = table.expert_of_mblock(m0 + local / nb);
  const int s0 = max(table.mblock_begin[e], m0);
  const int s1 = min(table.mblock_begin[e + 1], m1);
  const sm90::GroupedTile g =
      sm90::group_order(s0, s1, nb, local - (s0 - m0) * nb, kTileGroupMBlocks);
  return PhaseTile{fc1, g.mblock, g.n_block, e};
}

// The run of same-phase tiles (FC1 or FC2 of one macrobatch) that holds index t in the tile
// order above: its phase, macrobatch and index range [begin, end). nb1 / nb2: FC1 / FC2
// tiles per m-block.
struct PhaseRun {
  bool fc1;
  int macro;
  int begin, end;
};

__device__ __forceinline__ PhaseRun phase_run(const MacrobatchRing& r, int nb1, int nb2, int t) {
  const int last = r.mblocks_in(r.n_macro - 1);
  const int first = (r.n_macro == 1 ? last : r.per_macro) * nb1;
  if (t < first) return {true, 0, 0, first};
  int base = first;
  const int fc1_full = r.per_macro * nb1;
  const int pair = fc1_full + r.per_macro * nb2;
  const int full_pairs = r.n_macro > 2 ? r.n_macro - 2 : 0;
  if (t - base < full_pairs * pair) {
    const int k = (t - base) / pair, p0 = base + k * pair;
    return t - p0 < fc1_full ? PhaseRun{true, k + 1, p0, p0 + fc1_full}
                             : PhaseRun{false, k, p0 + fc1_full, p0 + pair};
  }
  base += full_pairs * pair;
  if (r.n_macro >= 2) {
    if (t - base < last * nb1) return {true, r.n_macro - 1, base, base + last * nb1};
    base += last * nb1;
    if (t - base < r.per_macro * nb2) {
      return {false, r.n_macro - 2, base, base + r.per_macro * nb2};
    }
    base += r.per_macro * nb2;
  }
  return {false, r.n_macro - 1, base, base + last * nb2};
}

// Tile t of the order above.
__device__ __forceinline__ PhaseTile tile_at(const MacrobatchRing& r,
                                             const sm90::MBlockTable& table, int nb1, int nb2,
                                             int t) {
  const PhaseRun run = phase_run(r, nb1, nb2, t);
  const int m0 = run.macro * r.per_macro;
  return grouped_tile(table, run.fc1, m0, m0 + r.mblocks_in(run.macro), run.fc1 ? nb1 : nb2,
                      t - run.begin);
}

}  // namespace mok
