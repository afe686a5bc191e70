// The forward megakernel's row-pulling blocks: copy every scheduled token row from its source
// rank's published buffer (a peer's over NVLink, or local) into the row buffer, and count the
// rows of each 128-row m-block (rows_ready) so FC1 tiles can start.
//
// Why bulk copies: a block copying with vector loads keeps only what its registers hold in
// flight (~24 KB with 12 warps) and moved ~20 GB/s; with up to `slots` whole rows (most of
// 192 KB of shared memory) in flight as 1-D TMA loads, written out as 1-D TMA stores, a block
// moves ~30 GB/s (both measured at EP=1, docs/perf-log.md).
//
// Roles inside the block: warp 0 loads, warp 1 stores; each of their first `lanes` lanes owns
// one row of every step (so up to `lanes` loads and stores are issued at once), and a slot
// is free again as soon as its row's store has read it. Rows go in chunks (minibatches) of
// placement.chunk_rows consecutive rows of one macrobatch; comm block b takes chunks b,
// b + comm_blocks, ... so the m-blocks fill in schedule order. A chunk is published once all
// its stores have finished: bulk_wait (writes performed) -> fence.proxy.async (async-proxy
// writes before the generic release) -> red.release per m-block; FC1's producer acquires,
// then fences the async proxy before its TMA reads. (A first version - one storing thread, a
// publish every few rows - moved only ~13 GB/s per block: docs/perf-log.md.)
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "comm/wire_row.cuh"
#include "common/ptx.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/sm90/tma.cuh"
#include "megakernel/macrobatch_ring.cuh"
#include "quant/fp8_rows.h"

namespace mok {

// The GEMM memory a row-pulling block uses for whole-row slots: the epilogue buffers and the
// stage ring's operand tiles, which a megakernel's shared storage lays out back to back
// (EpilogueBuffers first, then the stage ring with a and b first; each kernel asserts it).
template <class Ring>
constexpr size_t pull_bytes() {
  return sizeof(sm90::EpilogueBuffers) + sizeof(Ring::a) + sizeof(Ring::b);
}
constexpr size_t kPullBytes = pull_bytes<sm90::StageRing>();
static_assert(offsetof(sm90::StageRing, a) == 0 &&
                  offsetof(sm90::StageRing, b) == sizeof(sm90::StageRing::a),
              "ring.a and ring.b lie back to back");

// Whole-row slots of `row_bytes` (a bf16 row: 2 H; an FP8 wire row: WireRow::row_bytes) in
// `bytes` of shared memory.
__host__ __device__ constexpr int pull_slots(int row_bytes, size_t bytes = kPullBytes) {
  const size_t fit = bytes / size_t(row_bytes);
  return fit < kPullMaxSlots ? int(fit) : kPullMaxSlots;
}

struct RowSource {
  const int64_t* peer_bases;  // [world] workspace base of each rank
  const int32_t* row_slot;    // [rows] flat (source, token, k) of each row
  int per_rank, topk;         // slots per rank (max_tokens * topk), k per token
  int world;                  // ranks (<= 32: one lane holds each rank's base)
};

// The row tensors one pull fills, each published by every rank as [max_tokens, H] at its own
// byte offset of the workspace: forward's x, backward's dY, or (backward recomputing FC1)
// both, schedule row r landing at the same place of each.
constexpr int kMaxRowStreams = 2;
struct RowStreams {
  int64_t offset[kMaxRowStreams];
  __nv_bfloat16* dst[kMaxRowStreams];
  int count;
};

struct PullRing {
  uint8_t* data;  // slots x row_bytes, 16-byte aligned
  uint64_t* full;
  uint64_t* empty;
  int slots;
  int lanes;  // rows in flight per step: lanes of the loading and the storing warp
};

using sm90::MBlockTable;

// How the pull walks the schedule and where each row goes: macrobatch by macrobatch (one
// without the ring), in chunks (minibatches) of chunk_rows rows, each row at its schedule
// position or, with the ring, in its m-block's slot once that slot is free.
struct RowPlacement {
  MacrobatchRing ring;
  MBlockTable table;
  int chunk_rows;               // minibatch: rows pulled and published together
  // A macrobatch's slot is free once slot_done[k] counts all its users: users_per_unit for
  // each of its units - its m-blocks (forward: FC2 tile halves per m-block), or with
  // users_begin (a prefix over the macrobatches) users_begin[k + 1] - users_begin[k] units
  // (backward: tiles, each counted by both consumer warpgroups).
  const uint32_t* slot_done;    // [macrobatches]
  int users_per_unit;
  const int32_t* users_begin;   // [macrobatches + 1] or null
  bool wait_slots;              // false in profiling variants without FC2 or waits
  uint64_t timeout_ns;
  int* report;
  __device__ int64_t place(int r) const {
    if (!ring.on) return r;
    const int e = table.expert_of_row(r);
    const int mblock = table.mblock_of_row(r, e);
    return ring.slot_row0(mblock) + (r - table.first_row(mblock, e));
  }
  // Until every user of the macrobatch that held k's slot before is done with it.
  __device__ void wait_slot(int k) const {
    const int earlier = k - ring.slots;
    if (!ring.on || earlier < 0 || !wait_slots) return;
    const int units = users_begin != nullptr ? users_begin[earlier + 1] - users_begin[earlier]
                                             : ring.mblocks_in(earlier);
    const uint32_t users = uint32_t(units) * uint32_t(users_per_unit);
    sm90::counter_wait(&slot_done[earlier], users, timeout_ns, sm90::kWaitRingSlot, k, earlier,
                       report);
    fence_proxy_async_global();  // the users' reads (TMA) before this lane's bulk stores
  }
};

__device__ __forceinline__ void init_pull_ring(const PullRing& ring) {
  for (int i = 0; i < ring.slots; ++i) {
    sm90::mbar_init(&ring.full[i], 1);
    sm90::mbar_init(&ring.empty[i], 1);
  }
  sm90::fence_barrier_init();
}

// Counts rows [r0, r1) into their m-blocks (one release per m-block touched).
__device__ __forceinline__ void publish_rows(const MBlockTable& t, int r0, int r1,
                                             uint32_t* rows_ready) {
  int r = r0;
  while (r < r1) {
    const int e = t.expert_of_row(r);
    const int mblock = t.mblock_of_row(r, e);
    const int end = min(r1, min(t.first_row(mblock, e) + kGemmBlockM, t.row_begin[e + 1]));
    red_release_gpu_add_u32(&rows_ready[mblock], end - r);
    r = end;
  }
}

// Row `r` of the schedule comes from this byte address (peer or local token buffer).
__device__ __forceinline__ const char* row_source(const RowSource& src, int flat,
                                                  int64_t lane_base, uint32_t row_bytes) {
  const int peer = flat / src.per_rank;
  // lane p of the warp holds rank p's token buffer address (world <= 32)
  const int64_t base = __shfl_sync(0xffffffffu, lane_base, peer);
  return reinterpret_cast<const char*>(base) +
         int64_t((flat - peer * src.per_rank) / src.topk) * row_bytes;
}

// Calls chunk(macro, c0, c1) for this comm block's chunks, in increasing row order: the
// schedule walked macrobatch by macrobatch (one without the ring), each cut into chunks of
// placement.chunk_rows rows that never cross a macrobatch, chunk g going to comm block
// g % comm_blocks.
template <class Chunk>
__device__ __forceinline__ void for_each_chunk(const RowPlacement& placement, int comm_block,
                                               int comm_blocks, Chunk chunk) {
  int g = 0;
  int m1 = macro_first_row(placement.ring, placement.table, 0);
  for (int k = 0; k < placement.ring.n_macro; ++k) {
    const int m0 = m1;
    m1 = macro_first_row(placement.ring, placement.table, k + 1);
    for (int c0 = m0; c0 < m1; c0 += placement.chunk_rows, ++g) {
      if (g % comm_blocks == comm_block) chunk(k, c0, min(c0 + placement.chunk_rows, m1));
    }
  }
}

// The loading warp of a row-pulling block: every row of its chunks, stream by stream, into
// ring slot q % slots (q: the rows it has loaded before) as one bulk copy of `row_bytes` from
// the source rank's published buffer. The schedule entries of the next step are fetched one
// step ahead: the two dependent global reads per row (row_slot, then the peer's base)
// otherwise cost more than the copy of a 4 KB row.
__device__ inline void load_rows_into_ring(const RowSource& src, const RowStreams& streams,
                                           uint32_t row_bytes, int comm_block, int comm_blocks,
                                           const PullRing& ring, const RowPlacement& placement) {
  const int lane = threadIdx.x % 32;
  const int lanes = ring.lanes;
  const int64_t peer_base = lane < src.world ? src.peer_bases[lane] : 0;
  int seq = 0;  // rows this block has handled: row seq sits in slot seq % slots
  for_each_chunk(placement, comm_block, comm_blocks, [&](int, int c0, int c1) {
    for (int stream = 0; stream < streams.count; ++stream) {
      const int64_t lane_base = lane < src.world ? peer_base + streams.offset[stream] : 0;
      int flat_next = lane < lanes && c0 + lane < c1 ? src.row_slot[c0 + lane] : 0;
      for (int base = c0; base < c1; base += lanes) {
        // Every row number q is used exactly once, so each slot's barriers advance one
        // phase per use and the parities stay right.
        const int step = min(lanes, c1 - base);
        const int q = seq + lane;
        seq += step;
        const int flat = flat_next;
        const int ahead = base + lanes + lane;
        flat_next = lane < lanes && ahead < c1 ? src.row_slot[ahead] : 0;
        const char* from = row_source(src, flat, lane_base, row_bytes);
        if (lane >= step) continue;
        const int slot = q % ring.slots;
        sm90::mbar_wait(&ring.empty[slot], ((q / ring.slots) & 1) ^ 1, placement.timeout_ns,
                        sm90::kWaitPullSlot, base + lane, slot, placement.report);
        sm90::mbar_arrive_expect_tx(&ring.full[slot], row_bytes);
        sm90::bulk_load(ring.data + size_t(slot) * row_bytes, from, row_bytes,
                        &ring.full[slot]);
      }
    }
  });
}

// The storing warp of a row-pulling block: the loader's rows in the same order, each stored by
// `store_row(slot, r, stream)` (bulk stores, and with kPlainStores plain stores of the lane's
// too) from its ring slot to its place. A lane keeps two stores in flight: a slot is freed once
// the lane's next store is issued and the one before has read it (the loader's rows stay
// `slots - lanes` ahead, so this cannot hold back a load the next store needs); the chunk's
// last slot is freed before it is published. Before a chunk's first store, the wait for its
// macrobatch's slot (placement.wait_slot) - after every earlier chunk of this block has been
// published, so a chunk never holds back rows a waited-for tile needs.
// `macro_rows` (or null): also counts every published row per macrobatch, for a reader that
// waits once for all of a macrobatch's rows.
template <bool kPlainStores, class StoreRow>
__device__ inline void store_rows_from_ring(int streams, uint32_t slot_bytes, int comm_block,
                                            int comm_blocks, const PullRing& ring,
                                            const RowPlacement& placement, uint32_t* rows_ready,
                                            uint32_t* macro_rows, StoreRow store_row) {
  const int lane = threadIdx.x % 32;
  const int lanes = ring.lanes;
  int seq = 0;
  for_each_chunk(placement, comm_block, comm_blocks, [&](int macro, int c0, int c1) {
    placement.wait_slot(macro);
    int held = -1;  // this lane's slot whose store may still be reading it
    for (int stream = 0; stream < streams; ++stream) {
      for (int base = c0; base < c1; base += lanes) {
        const int step = min(lanes, c1 - base);
        const int q = seq + lane;
        seq += step;
        if (lane >= step) continue;
        const int r = base + lane;
        const int slot = q % ring.slots;
        sm90::mbar_wait(&ring.full[slot], (q / ring.slots) & 1, placement.timeout_ns,
                        sm90::kWaitPullRow, r, slot, placement.report);
        store_row(ring.data + size_t(slot) * slot_bytes, r, stream);
        sm90::bulk_commit();
        sm90::bulk_wait_read<1>();  // the lane's previous store has read its slot
        if (held >= 0) sm90::mbar_arrive(&ring.empty[held]);
        held = slot;
      }
    }
    if (held >= 0) {
      sm90::bulk_wait_read<0>();
      sm90::mbar_arrive(&ring.empty[held]);
    }
    // Publish the chunk: every storing lane's writes performed (bulk, then plain ones fenced),
    // then one release per m-block (cumulative over the lanes' writes, ordered by the
    // __syncwarp); the async-proxy fence orders them before FC1's TMA reads.
    if (lane < lanes) {
      sm90::bulk_wait<0>();
      if constexpr (kPlainStores) __threadfence();
    }
    __syncwarp();
    if (lane == 0) {
      fence_proxy_async_global();
      publish_rows(placement.table, c0, c1, rows_ready);
      if (macro_rows != nullptr) red_release_gpu_add_u32(&macro_rows[macro], uint32_t(c1 - c0));
    }
  });
}

// `streams`: the row tensors filled, each row of a chunk copied from every stream before the
// chunk is published. `placement`: where each schedule row goes in them (place(r)) and, with
// the ring, the wait for a macrobatch's slot to be free (wait_slot(k)).
__device__ inline void pull_rows_bulk(const RowSource& src, const RowStreams& streams,
                                      int hidden, int comm_block, int comm_blocks,
                                      const PullRing& ring, const RowPlacement& placement,
                                      uint32_t* rows_ready, uint32_t* macro_rows = nullptr) {
  const uint32_t row_bytes = uint32_t(hidden) * 2;
  const int warp = threadIdx.x / 32;
  if (warp == 0) {
    load_rows_into_ring(src, streams, row_bytes, comm_block, comm_blocks, ring, placement);
  } else if (warp == 1) {
    store_rows_from_ring<false>(
        streams.count, row_bytes, comm_block, comm_blocks, ring, placement, rows_ready,
        macro_rows, [&](const uint8_t* slot, int r, int stream) {
          sm90::bulk_store(streams.dst[stream] + placement.place(r) * hidden, slot, row_bytes);
        });
  }
}

// The converting warps of a block pulling MXFP8 wire rows (pull_wire_rows_bulk): every warp
// but the loader. Named barrier 1 while the block pulls: it runs no GEMM tile before the pull
// ends.
constexpr int kPullConverterWarps = kGemmThreads / 32 - 1;
constexpr int kPullConvertBarrier = 1;

// The pull under MXFP8: the source ranks publish wire rows (comm/wire_row.cuh), the loading
// warp brings them into the ring as pull_rows_bulk's does (half the bytes of a bf16 row), and
// the other warps write each one out dequantized - `write_row(wire_row, dst_row, lane)` for the
// warp's 32 lanes, row q of the block's sequence by warp 1 + q % kPullConverterWarps, straight
// to global memory. A slot is free once its warp has read it (its loads feed the stores it
// issues, so __syncwarp orders them). A chunk is published after every converting warp has
// stored its rows of it and fenced them: plain stores, then fence -> named barrier -> the
// async-proxy fence and one release per m-block; FC1's producer acquires and fences the async
// proxy before its TMA reads, as for the bulk stores. (The blockwise pull, which copies codes
// as they are, ran this way until 2026-12-06: ~11 GB/s per block at H = 2048; a line through
// two shapes' pull times puts a fixed ~120 ns per row per block on it - docs/perf-log.md.)
template <class WriteRow>
__device__ inline void pull_wire_rows(const RowSource& src, int64_t tokens_offset,
                                      const WireRow& wire, int comm_block, int comm_blocks,
                                      const PullRing& ring, const RowPlacement& placement,
                                      uint32_t* rows_ready, WriteRow write_row) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    load_rows_into_ring(src, RowStreams{{tokens_offset, 0}, {nullptr, nullptr}, 1},
                        uint32_t(wire.row_bytes), comm_block, comm_blocks, ring, placement);
    return;
  }
  const int converter = warp - 1;
  int seq = 0;
  for_each_chunk(placement, comm_block, comm_blocks, [&](int macro, int c0, int c1) {
    if (lane == 0) placement.wait_slot(macro);
    __syncwarp();
    for (int r = c0; r < c1; ++r, ++seq) {
      if (seq % kPullConverterWarps != converter) continue;
      const int slot = seq % ring.slots;
      sm90::mbar_wait(&ring.full[slot], (seq / ring.slots) & 1, placement.timeout_ns,
                      sm90::kWaitPullRow, r, slot, placement.report);
      write_row(ring.data + size_t(slot) * wire.row_bytes, placement.place(r), lane);
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(&ring.empty[slot]);
    }
    __threadfence();
    sm90::named_barrier_sync(kPullConvertBarrier, 32 * kPullConverterWarps);
    if (converter == 0 && lane == 0) {
      // The plain stores before FC1's TMA reads of them, as the backward megakernel's writers
      // of plain stores order theirs (its readers fence the async proxy too).
      fence_proxy_async_global();
      publish_rows(placement.table, c0, c1, rows_ready);
    }
  });
}

// MXFP8: each wire row dequantized into the bf16 row buffer `rows`, 16 codes a lane at a time.
__device__ inline void pull_wire_rows_bulk(const RowSource& src, int64_t tokens_offset,
                                           const WireRow& wire, int hidden,
                                           __nv_bfloat16* rows, int comm_block, int comm_blocks,
                                           const PullRing& ring, const RowPlacement& placement,
                                           uint32_t* rows_ready) {
  const int vecs = (hidden + 15) / 16;  // 16-code vectors of a row (inside the padded codes)
  pull_wire_rows(src, tokens_offset, wire, comm_block, comm_blocks, ring, placement, rows_ready,
                 [&](const uint8_t* codes, int64_t place, int lane) {
                   __nv_bfloat16* row = rows + place * hidden;
                   for (int v = lane; v < vecs; v += 32) {
                     const uint4 c = sm90::ld_shared_16(codes + 16 * v);
                     const uint8_t scale = codes[wire.code_bytes + 16 * v / wire.block];
                     store_dequantized_codes(row + 16 * v, make_int4(c.x, c.y, c.z, c.w),
                                             e8m0_factor(scale), 16 * v + 8 < hidden);
                   }
                 });
}

// Blockwise FP8: each wire row's codes go out as one bulk store, as pull_rows_bulk's rows do,
// and its scale codes, read by the same lane, are scattered into the transposed scales (the FP8
// engine's A operand, Fp8Rows) as plain stores, so FC1 multiplies x's codes with no
// conversion. Measured against pull_wire_rows' converting warps (2026-12-06, one H100; docs/perf-log.md Blockwise FP8): at
// H = 2048 the pull 499-521 -> 349-368 us (FC1 had waited for its rows); at H = 7168 768-810 ->
// 1348-1411 us, unexplained (not the slots' alignment), where FC1 never waits for rows.
__device__ inline void pull_wire_codes_bulk(const RowSource& src, int64_t tokens_offset,
                                            const WireRow& wire, int hidden,
                                            const Fp8Rows& dst, int comm_block,
                                            int comm_blocks, const PullRing& ring,
                                            const RowPlacement& placement,
                                            uint32_t* rows_ready) {
  const uint32_t code_bytes = uint32_t(hidden + 15) / 16 * 16;  // <= the row strides (checked)
  const int blocks = (hidden + wire.block - 1) / wire.block;
  const int warp = threadIdx.x / 32;
  if (warp == 0) {
    load_rows_into_ring(src, RowStreams{{tokens_offset, 0}, {nullptr, nullptr}, 1},
                        uint32_t(wire.row_bytes), comm_block, comm_blocks, ring, placement);
  } else if (warp == 1) {
    store_rows_from_ring<true>(
        1, uint32_t(wire.row_bytes), comm_block, comm_blocks, ring, placement, rows_ready,
        nullptr, [&](const uint8_t* slot, int r, int) {
          const int64_t place = placement.place(r);
          sm90::bulk_store(dst.codes + place * dst.code_stride, slot, code_bytes);
          // The scale codes in 16-byte vectors (wire rows are 16-byte multiples past them).
          for (int b0 = 0; b0 < blocks; b0 += 16) {
            const uint4 v = sm90::ld_shared_16(slot + wire.code_bytes + b0);
            const uint8_t* scale = reinterpret_cast<const uint8_t*>(&v);
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              if (b0 + j < blocks) dst.scales[(b0 + j) * dst.scale_stride + place] = scale[j];
            }
          }
        });
  }
}

}  // namespace mok
