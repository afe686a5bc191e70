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
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tma.cuh"

namespace mok {

struct MacrobatchRing {
  bool on;
  int per_macro;  // m-blocks per macrobatch (all of them when off)
  int slots;      // macrobatches resident at once (ring on)
  int mblocks;    // m-blocks of the whole schedule
  int n_macro;    // macrobatches (>= 1)

  __host__ __device__ static MacrobatchRing make(bool on, int per_macro, int slots,
                                                 int mblocks) {
    if (!on || per_macro <= 0) per_macro = mblocks > 0 ? mblocks : 1;
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

struct PhaseTile {
  bool fc1;
  int mblock;   // global m-block index
  int n_block;
};

// Tile t of the order above; nb1 / nb2: FC1 / FC2 tiles per m-block.
__device__ __forceinline__ PhaseTile tile_at(const MacrobatchRing& r, int nb1, int nb2, int t) {
  const int last = r.mblocks_in(r.n_macro - 1);
  auto in = [&](bool fc1, int macro, int local) {
    const int nb = fc1 ? nb1 : nb2;
    return PhaseTile{fc1, macro * r.per_macro + local / nb, local % nb};
  };
  const int first = (r.n_macro == 1 ? last : r.per_macro) * nb1;
  if (t < first) return in(true, 0, t);
  t -= first;
  const int fc1_full = r.per_macro * nb1;
  const int pair = fc1_full + r.per_macro * nb2;
  const int full_pairs = r.n_macro > 2 ? r.n_macro - 2 : 0;
  if (t < full_pairs * pair) {
    const int k = t / pair + 1, off = t % pair;
    return off < fc1_full ? in(true, k, off) : in(false, k - 1, off - fc1_full);
  }
  t -= full_pairs * pair;
  if (r.n_macro >= 2) {
    if (t < last * nb1) return in(true, r.n_macro - 1, t);
    t -= last * nb1;
    if (t < r.per_macro * nb2) return in(false, r.n_macro - 2, t);
    t -= r.per_macro * nb2;
  }
  return in(false, r.n_macro - 1, t);
}

// Where the row pull puts schedule row r, and when it may (megakernel/row_pull.cuh).
struct RowPlacement {
  MacrobatchRing ring;
  const int32_t* row_begin;     // [E + 1] expert row ranges
  const int32_t* mblock_begin;  // [E + 1] first m-block of each expert
  int num_experts, total_rows;
  int chunk_rows;               // minibatch: rows pulled and published together
  const uint32_t* fc2_done;     // [macrobatches] FC2 tile halves done reading act
  int fc2_per_mblock;           // FC2 tile halves of one m-block
  bool wait_slots;              // false in profiling variants without FC2 or waits
  uint64_t timeout_ns;
  int* report;

  // First schedule row of macrobatch k (the total for k = n_macro).
  __device__ int macro_begin(int k) const {
    const int mblock = k * ring.per_macro;
    if (k == 0) return 0;
    if (mblock >= ring.mblocks) return total_rows;
    const int e = sm90::expert_at(mblock_begin, num_experts, mblock);
    return row_begin[e] + (mblock - mblock_begin[e]) * kGemmBlockM;
  }
  __device__ int64_t place(int r) const {
    if (!ring.on) return r;
    const int e = sm90::expert_at(row_begin, num_experts, r);
    const int local = r - row_begin[e];
    return ring.slot_row0(mblock_begin[e] + local / kGemmBlockM) + local % kGemmBlockM;
  }
  // Until every FC2 tile of the macrobatch that used k's slot before has read it.
  __device__ void wait_slot(int k) const {
    const int earlier = k - ring.slots;
    if (!ring.on || earlier < 0 || !wait_slots) return;
    const uint32_t target = uint32_t(ring.mblocks_in(earlier)) * fc2_per_mblock;
    if (ld_acquire_gpu_u32(&fc2_done[earlier]) < target) {
      const uint64_t start = globaltimer_ns();
      while (ld_acquire_gpu_u32(&fc2_done[earlier]) < target) {
        if (globaltimer_ns() - start > timeout_ns) {
          sm90::trap_with_report(report, sm90::kWaitRingSlot, k, earlier);
        }
      }
    }
    fence_proxy_async_global();  // the FC2 reads (TMA) before this lane's bulk stores
  }
};

}  // namespace mok
