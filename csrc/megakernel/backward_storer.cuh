// The backward megakernel's epilogues in two halves, as forward's (epilogue_storer.cuh, whose
// handoff protocol this uses): a consumer warpgroup converts a finished tile's accumulators
// into bf16 rows in its two staging slots and hands them on; a storer warp of the producer
// warpgroup (one per consumer warpgroup) turns them into what the tile writes, stores it and
// counts it, while the consumers run their next tile's MMAs:
//   FC1 (recompute)  forward's FC1 storer path (store_fc1_staged: h, then act(h) * prob, the
//                    same bits), counted in kFc1Stored once its stores are in memory;
//   FC2-dgrad        dA as bf16 in slot 0 - the rounding point the activation backward starts
//                    from (dgrad_epilogue.cuh: dA' = bf16(dA)), so staging it loses nothing;
//                    h, dA and dh of 64 rows do not fit two slots, so the storer loads h (gate
//                    and up) into slot 1 kDgrad2PartRows rows at a time, runs the activation
//                    backward (dh over dA and h in place), writes each row's dprob partial in
//                    the consumer's order, stores the part's dh, and counts kDhStored once in
//                    memory - the consumer no longer waits for its stores to complete;
//   FC1-dgrad        dX rows (unswizzled, one row per bulk store into its (token, k) slot on
//                    the source rank) and, for n-block 0, each row's dprob summed from its
//                    partials;
//   dW (bf16)        the tile's rows by TMA (an expert's partial last block: copied out).
// fp32 weight gradients (main_grad's vector atomics) and carries stay on the consumer: they
// leave the registers as fire-and-forget stores, with nothing staged to hand on.
// The storer also counts the ring's macro_done for the tiles it takes (their ring slot's h,
// dh and dprob partials are read and written until it is done); the consumer counts the rest.
// Deadlock freedom: a storer waits only for its consumer's handoffs, its own stores and loads,
// and (FC2-dgrad, recomputing) the m-block's FC1 count - which the tile's producer saw
// complete before it loaded the tile's first stage, so the wait is an acquire that never
// blocks; a storer's work for tile i thus depends on nothing but tiles below i, and the
// consumers' waits for free slots on nothing but their own storer.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx.cuh"
#include "common/vec.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/sm90/tma.cuh"
#include "megakernel/backward_args.cuh"
#include "megakernel/backward_tiles.cuh"
#include "megakernel/backward_trace.cuh"
#include "megakernel/dgrad_epilogue.cuh"
#include "megakernel/epilogue_storer.cuh"

namespace mok {

// A backward handoff: StagedRecord's fields (StagingWriter's protocol) and the consumer's tile
// sequence number, the trace row of the storer's stamps.
struct BackwardRecord {
  int kind;
  int slots;
  int has_rows;
  int row0;        // the warpgroup's first row in the row buffers (dW: in the gradient)
  int prob_row0;   // its first schedule row (row_prob, row_slot)
  int rows_valid;  // rows of the 64 that exist
  int full;        // all 64 rows exist (TMA stores), else copied out
  int col0;        // first output column
  int counter;     // FC1 and the dgrads: the m-block
  int seq;         // the consumer's tile index
};

// The backward's record kinds after forward's (StagedKind; kStagedFc1 is the FC1 recompute).
enum BackwardStagedKind : int {
  kStagedDgrad2 = kStagedEnd + 1,
  kStagedDgrad1,
  kStagedWgrad2,
  kStagedWgrad1
};

// FC2-dgrad: rows of h the storer loads at once into slot 1 (gate and up of kDgrad2Cols
// columns each), as boxes of kDgrad2PartRows x 64 columns: box b's gate at
// b * kStagedBoxBytes, its up kPartBoxBytes after it, so dh's up half - written over the gate
// - has write_staged's box stride and row layout (a part's first row is a multiple of 8).
constexpr int kDgrad2PartRows = 32;
constexpr int kPartBoxBytes = kDgrad2PartRows * 128;
static_assert(2 * kPartBoxBytes == sm90::kStagedBoxBytes &&
                  kDgrad2Cols / 64 * sm90::kStagedBoxBytes == kStagedSlotBytes,
              "a part's gate and up boxes fill slot 1, dA fills slot 0");

// What the storers read besides the launch's arguments (in shared memory: their registers are
// few).
struct BackwardStorerTargets {
  StorerTargets fc1;          // store_fc1_staged's: row_prob, h and act
  uint32_t fc1_per_mblock;    // kFc1Stored complete for an m-block (0: h is forward's)
  int nb_dgrad2;              // dprob partials per row
  int mblocks_per_macro;      // the counts' macrobatch of an m-block
  uint32_t* macro_done;       // the ring's slot reuse, or null (no ring)
};

// One 16-byte chunk (8 columns) of one row: dA at da_off, h's gate at g_off and up at u_off;
// dgate goes over dA and (gated) dup over the gate. Word e holds columns 2e, 2e + 1, the ones
// lane e of the MMA quad held: their dprob terms go into s[e], so each s[e] sums what that
// lane summed, in its order.
template <int kAct>
__device__ __forceinline__ void dgrad2_chunk(uint32_t da_off, uint32_t g_off, uint32_t u_off,
                                             float p, float (&s)[4]) {
  constexpr bool kGated = sm90::gated_epilogue<kAct>();
  uint32_t da[4], g[4], u[4];
  ld_shared_v4(da_off, da);
  ld_shared_v4(g_off, g);
  if constexpr (kGated) ld_shared_v4(u_off, u);
  uint32_t dgate[4], dup[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float dg[2], du[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      dgrad_element<kAct>(bf16_of(da[e], c), bf16_of(g[e], c), kGated ? bf16_of(u[e], c) : 0.f,
                          p, dg[c], du[c], s[e]);
    }
    dgate[e] = pack_bf16x2(dg[0], dg[1]);
    dup[e] = pack_bf16x2(du[0], du[1]);
  }
  st_shared_v4(da_off, dgate);
  if constexpr (kGated) st_shared_v4(g_off, dup);
}

// An FC2-dgrad handoff: dA in slot 0 as write_staged<kDgrad2Cols> left it. Lane l takes row
// first + l of each part: its chunks in the consumer's order (jj, then box), its dprob partial
// the consumer's quad sum (lanes 0 + 1, then + (2 + 3)). h_bar / h_phase: this storer's
// barrier for h's loads. On return the stores have read the slots.
template <int kAct, class Stamp>
__device__ __forceinline__ void store_dgrad2_staged(uint8_t* buf, const BackwardRecord& r,
                                                    const BackwardArgs& a,
                                                    const BackwardMaps& m,
                                                    const BackwardStorerTargets& tg,
                                                    uint64_t* h_bar, uint32_t& h_phase,
                                                    int lane, Stamp stamp) {
  constexpr bool kGated = sm90::gated_epilogue<kAct>();
  constexpr int kHalves = kGated ? 2 : 1;
  constexpr int kBoxes = kDgrad2Cols / 64;
  uint8_t* h_slot = buf + kStagedSlotBytes;
  const uint32_t da_base = sm90::smem_addr(buf), h_base = sm90::smem_addr(h_slot);
  if (tg.fc1_per_mblock > 0 && lane == 0) {
    // h comes from this launch's FC1 tiles: acquired by the lane whose TMA loads read it.
    sm90::counter_wait(&a.per_mblock[kFc1Stored][r.counter], tg.fc1_per_mblock, a.timeout_ns,
                       sm90::kWaitFc1Done, -1, r.counter, a.report);
    fence_proxy_async_global();
  }
  const sm90::EpilogueTensor dh{&m.dh_part, a.dh, a.f1};
  for (int first = 0; first < r.rows_valid; first += kDgrad2PartRows) {
    const int row = first + lane;
    const float p = row < r.rows_valid ? a.row_prob[r.prob_row0 + row] : 1.f;
    // Slot 1 is free for h: the part before's dup stores have read it (lane 0's bulk group)
    // and every lane's accesses come before the loads' async-proxy writes.
    if (lane == 0) sm90::bulk_wait_read<0>();
    sm90::fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) {
      sm90::mbar_arrive_expect_tx(h_bar, kHalves * kBoxes * kPartBoxBytes);
      for (int box = 0; box < kBoxes; ++box) {
        for (int half = 0; half < kHalves; ++half) {
          sm90::tma_load_4d(h_slot + box * sm90::kStagedBoxBytes + half * kPartBoxBytes,
                            &m.h_part, h_bar, r.col0 + 64 * box, half, r.row0 + first, 0);
        }
      }
    }
    sm90::mbar_wait(h_bar, h_phase, a.timeout_ns, sm90::kWaitHTile, -1, r.counter, a.report);
    h_phase ^= 1;
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1
    for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
      for (int box = 0; box < kBoxes; ++box) {
        const uint32_t g_off =
            h_base + box * sm90::kStagedBoxBytes + lane * 128 + ((jj ^ (lane % 8)) * 16);
        dgrad2_chunk<kAct>(staged_chunk(da_base, 8 * box + jj, row), g_off,
                           g_off + kPartBoxBytes, p, s);
      }
    }
    if (row < r.rows_valid) {
      a.dprob_part[int64_t(r.row0 + row) * tg.nb_dgrad2 + r.col0 / kDgrad2Cols] =
          (s[0] + s[1]) + (s[2] + s[3]);
    }
    // The part's dh: dgate in slot 0's rows, dup over slot 1's gate boxes.
    if (r.full) {
      sm90::fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) {
        for (int box = 0; box < kBoxes; ++box) {
          if (r.col0 + 64 * box >= a.ffn) continue;
          sm90::tma_store_4d(dh.map, buf + box * sm90::kStagedBoxBytes + first * 128,
                             r.col0 + 64 * box, 0, r.row0 + first, 0);
          if constexpr (kGated) {
            sm90::tma_store_4d(dh.map, h_slot + box * sm90::kStagedBoxBytes, r.col0 + 64 * box,
                               1, r.row0 + first, 0);
          }
        }
        sm90::bulk_commit();
      }
    } else {
      __syncwarp();
      const int rows = min(kDgrad2PartRows, r.rows_valid - first);
      sm90::copy_staged_rows<kDgrad2Cols>(buf + first * 128, dh, 0, r.row0 + first, rows,
                                          r.col0, a.ffn, lane, 32);
      if constexpr (kGated) {
        sm90::copy_staged_rows<kDgrad2Cols>(h_slot, dh, 1, r.row0 + first, rows, r.col0, a.ffn,
                                            lane, 32);
      }
    }
  }
  stamp();
  if (lane == 0) sm90::bulk_wait_read<0>();
}

// An FC1-dgrad handoff: dX rows as write_scatter_staged<kCols> left them, each to its (token,
// k) slot; with n-block 0 also the row's dprob: its FC2-dgrad tiles' partials (complete: the
// tile's producer waited for them; acquired again for this lane's loads), in n-block order.
// On return the stores have read the slots.
template <int kCols>
__device__ __forceinline__ void store_dgrad1_staged(const uint8_t* buf, const BackwardRecord& r,
                                                    const BackwardArgs& a,
                                                    const BackwardStorerTargets& tg, int lane) {
  const uint32_t bytes = uint32_t(min(kCols, a.hidden - r.col0)) * 2;
  for (int row = lane; row < r.rows_valid; row += 32) {
    const int flat = a.row_slot[r.prob_row0 + row];
    char* slot = source_slot(a.peer_bases, a.per_rank, flat, a.slots_offset,
                             int64_t(a.hidden) * 2);
    sm90::bulk_store(slot + int64_t(r.col0) * 2, buf + row * sm90::kScatterRowBytes, bytes);
    if (r.col0 == 0) {
      ld_acquire_gpu_u32(&a.per_mblock[kDhStored][r.counter]);
      const float* part = a.dprob_part + int64_t(r.row0 + row) * tg.nb_dgrad2;
      float dprob = 0.f;
      for (int j = 0; j < tg.nb_dgrad2; ++j) dprob += part[j];
      *reinterpret_cast<float*>(source_slot(a.peer_bases, a.per_rank, flat, a.values_offset,
                                            4)) = dprob;
    }
  }
  sm90::bulk_commit();
  sm90::bulk_wait_read<0>();
}

// A bf16 weight-gradient handoff: the tile's rows as write_staged<kGemmBlockN> left them
// (both slots). On return the stores have read the slots.
__device__ __forceinline__ void store_wgrad_staged(const uint8_t* buf, const BackwardRecord& r,
                                                   const BackwardArgs& a,
                                                   const BackwardMaps& m, int lane) {
  const bool wgrad2 = r.kind == kStagedWgrad2;
  const int n = wgrad2 ? a.ffn : a.hidden;
  const sm90::EpilogueTensor out{wgrad2 ? &m.dw2_store : &m.dw1_store, wgrad2 ? a.dw2 : a.dw1,
                                 n};
  if (r.full) {
    if (lane == 0) {
      sm90::issue_staged_boxes(out, buf, kGemmBlockN / 64, 0, r.row0, r.col0, n);
      sm90::bulk_wait_read<0>();
    }
  } else {
    sm90::copy_staged_rows<kGemmBlockN>(buf, out, 0, r.row0, r.rows_valid, r.col0, n, lane, 32);
  }
}

// Until the consumer's next handoff arrives on `full`. Forward's storer bounds this wait by
// twice the consumers' bound (run_storer): it spans one tile of its consumer's bounded
// waits. Here a consumer may run many tiles without a handoff (fp32 weight gradients,
// rounding tiles), so the bound restarts whenever it begins another tile (`tiles`, which its
// leader raises): a stuck consumer is reported by its own wait, and a stall of the storer's
// own within twice the bound.
__device__ __forceinline__ void wait_handoff(uint64_t* full, uint32_t parity,
                                             const int* tiles, uint64_t timeout_ns, int slot,
                                             int* report) {
  if (sm90::mbar_try_wait(full, parity)) return;
  int seen = *reinterpret_cast<const volatile int*>(tiles);
  uint64_t start = globaltimer_ns();
  while (!sm90::mbar_try_wait(full, parity)) {
    const int now = *reinterpret_cast<const volatile int*>(tiles);
    const uint64_t time = globaltimer_ns();
    if (now != seen) {
      seen = now;
      start = time;
    } else if (time - start > 2 * timeout_ns) {
      sm90::trap_with_report(report, sm90::kWaitStaging, -1, slot);
    }
  }
}

// The storer warp of one consumer warpgroup: takes its handoffs in order until the end record.
// kFc1Cols: FC1's activation columns per tile; kDgrad1Cols: FC1-dgrad's tile width. `trace`
// (diagnostic kernel, storer of consumer 0, lane 0; else null) stamps at the consumer's tile.
template <int kAct, int kFc1Cols, int kDgrad1Cols>
__device__ __forceinline__ void run_backward_storer(StagingHandoff<BackwardRecord>& hand,
                                                    uint8_t* buf, uint64_t* h_bar,
                                                    const int* consumer_tiles,
                                                    const BackwardArgs& a,
                                                    const BackwardMaps& m,
                                                    const BackwardStorerTargets& tg,
                                                    const BackwardTrace& trace) {
  const int lane = threadIdx.x % 32;
  uint32_t h_phase = 0;
  for (int q = 0;;) {
    const int slot = q % 2;
    const uint32_t parity = (q / 2) & 1;
    wait_handoff(&hand.full[slot], parity, consumer_tiles, a.timeout_ns, slot, a.report);
    const BackwardRecord& r = hand.rec[slot];
    if (r.slots == 2) {  // the consumer arrives on both slots together
      sm90::mbar_wait(&hand.full[1], parity, a.timeout_ns, sm90::kWaitStaging, -1, 1, a.report);
    }
    if (r.kind == kStagedEnd) {
      sm90::bulk_wait<0>();  // this lane's stores (peers' slots among them) complete first
      return;
    }
    const int seq = r.kind == kStagedSkip ? kBackwardTraceTiles : r.seq;  // skips: no row
    trace.stamp(seq, kBtStorerTook);
    auto made = [&] { trace.stamp(seq, kBtStorerMade); };
    if (r.kind == kStagedFc1) {
      // h stored: no stamp of its own (the slot row's one "made" step is act made).
      store_fc1_staged<kAct, kActBf16, kFc1Cols, false>(buf, r, tg.fc1, lane, trace, seq,
                                                        kBtStorerMade, kBtStorerMade);
    } else if (r.kind == kStagedDgrad2) {
      store_dgrad2_staged<kAct>(buf, r, a, m, tg, h_bar, h_phase, lane, made);
    } else if (r.kind == kStagedDgrad1) {
      store_dgrad1_staged<kDgrad1Cols>(buf, r, a, tg, lane);
      made();
    } else if (r.kind != kStagedSkip) {
      store_wgrad_staged(buf, r, a, m, lane);
      made();
    }
    // Used after the release (the record's entry is then the consumer's again).
    const int kind = r.kind, slots = r.slots, mblock = r.counter;
    const bool counted = kind == kStagedFc1 || kind == kStagedDgrad2;
    // Rows copied out and dprob partials (plain stores) are fenced by their writers.
    if (counted) __threadfence();
    __syncwarp();
    if (lane == 0) {
      for (int i = 0; i < slots; ++i) sm90::mbar_arrive(&hand.empty[(q + i) % 2]);
      trace.stamp(seq, kBtStorerReleased);
      const int macro = counted || kind == kStagedDgrad1 ? mblock / tg.mblocks_per_macro : 0;
      if (counted) {
        // TMA-stored rows are complete and ordered for the readers' TMA loads (the m-block's
        // later tiles) before the count.
        sm90::bulk_wait<0>();
        fence_proxy_async_global();
        const int p = kind == kStagedFc1 ? kFc1Stored : kDhStored;
        red_release_gpu_add_u32(&a.per_mblock[p][mblock], 1);
        red_release_gpu_add_u32(&a.per_macro[p][macro], 1);
      }
      if (tg.macro_done != nullptr && (counted || kind == kStagedDgrad1)) {
        // The tile is done with its ring slot (its reads returned, its writes complete).
        red_release_gpu_add_u32(&tg.macro_done[macro], 1);
      }
      trace.stamp(seq, kBtStorerDone);
    }
    q += slots;
  }
}

}  // namespace mok
