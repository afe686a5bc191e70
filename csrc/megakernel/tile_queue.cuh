// The forward megakernel's dynamic tile schedule. One global counter hands out tile indices in
// increasing order (atomicAdd), so a block takes its next tile when it is ready for one: the
// row-pulling blocks join the GEMM work once their rows are pulled, and a block that drew
// light tiles is not left idle. Inside a block the producer thread takes the index, decodes
// where the tile is, and passes both to the consumer warps through a small ring in shared
// memory; the consumers read the decoded fields there when they need them, so none of them
// occupies a register across the mainloop next to the accumulators.
//
// Why indices stay deadlock-free: they are taken in increasing order over the whole grid, a
// tile depends only on lower ones (or on the pull, which depends on nothing), and only a
// running block takes one, so the lowest unfinished tile can always proceed.
#pragma once

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tma.cuh"

namespace mok {

// A tile as the producer decoded it: its index (-1: no tiles left), phase, expert, m-block
// (global index), n-block, its rows' first place in the schedule (row0) and in rows / act
// (slot0: the same without the macrobatch ring), and the expert's rows from row0 on.
struct QueuedTile {
  int tile, fc1, expert, mblock, n_block, row0, slot0, rows_left;
};

// Entry: what the producer decoded (QueuedTile for forward, BackwardTile for backward); its
// first field `tile` is the index (-1: no tiles left).
template <class Entry>
struct TileQueue {
  Entry entry[kTileQueueDepth];
  uint64_t full[kTileQueueDepth];    // the producer's arrive
  uint64_t empty[kTileQueueDepth];   // one arrive per consumer warp, once done with the entry
};

constexpr int kTileQueueReaders = 4 * kGemmConsumers;  // consumer warps

template <class Entry>
__device__ __forceinline__ void init_tile_queue(TileQueue<Entry>& q) {
  for (int i = 0; i < kTileQueueDepth; ++i) {
    sm90::mbar_init(&q.full[i], 1);
    sm90::mbar_init(&q.empty[i], kTileQueueReaders);
  }
}

// Producer thread: the next tile of [0, end) from the grid-wide counter, or -1.
__device__ __forceinline__ int take_tile(uint32_t* counter, int end) {
  const int tile = static_cast<int>(atomicAdd(counter, 1u));
  return tile < end ? tile : -1;
}

// Producer thread: entry `seq` of the ring (the plain shared stores are published by the
// arrive's release and read after the consumers' acquiring wait).
template <class Entry>
__device__ __forceinline__ void push_tile(TileQueue<Entry>& q, int seq, const Entry& t,
                                          uint64_t timeout_ns, int* report) {
  const int slot = seq % kTileQueueDepth;
  sm90::mbar_wait(&q.empty[slot], ((seq / kTileQueueDepth) & 1) ^ 1, timeout_ns,
                  sm90::kWaitTileQueue, t.tile, slot, report);
  q.entry[slot] = t;
  sm90::mbar_arrive(&q.full[slot]);
}

// Every thread of a consumer warp: entry `seq`, valid until the warp releases it (waiting
// again for an entry not yet released returns at once).
template <class Entry>
__device__ __forceinline__ const Entry& wait_tile(TileQueue<Entry>& q, int seq,
                                                  uint64_t timeout_ns, int* report) {
  const int slot = seq % kTileQueueDepth;
  sm90::mbar_wait(&q.full[slot], (seq / kTileQueueDepth) & 1, timeout_ns, sm90::kWaitTileQueue,
                  seq, slot, report);
  return q.entry[slot];
}

// Every thread of a consumer warp, done with entry `seq`: the producer may refill it.
template <class Entry>
__device__ __forceinline__ void release_tile(TileQueue<Entry>& q, int seq) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) sm90::mbar_arrive(&q.empty[seq % kTileQueueDepth]);
}

}  // namespace mok
