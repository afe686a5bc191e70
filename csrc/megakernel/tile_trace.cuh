// Optional timestamps of a megakernel's blocks (BlockTrace), and the forward megakernel's
// layout of them (benchmarks/diagnostics/trace_tiles.py reads it; the backward's is
// backward_trace.cuh).
// Given a trace buffer, every block records clock64 at the phase boundaries of its first
// kTiles tiles, and a header: globaltimer and clock64 at its start and end (a time base
// shared by all SMs, and the SM clock's rate), when its pull ended and its ticket. Without
// one (null), each stamp is one uniform branch; none sits inside a k-loop.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"

namespace mok {

constexpr int kTraceTiles = 64;

// Per tile: [kTraceSlots] values, clock64 except kTrTileId.
enum TraceSlot : int {
  kTrTileStart = 0,   // consumer: before waiting for the tile's queue entry
  kTrTileQueued,      // consumer: the entry is read
  kTrMainloopEnd,     // consumer: accumulators complete
  kTrTileEnd,         // consumer: epilogue issued, entry released
  kTrTileId,          // tile index * 2 + (FC1 ? 1 : 0)
  kTrProducerStart,   // producer: before taking the index ahead
  kTrPushed,          // producer: the tile is queued for the consumers
  kTrReady,           // producer: its rows / FC1 activations are ready (and fenced)
  kTrLoadsIssued,     // producer: all its loads issued
  kTrStaged,          // consumer: the tile's rows are staged and handed to the storer
  kTrStorerTook,      // storer of consumer 0: the tile's handoff is taken (its full wait ends)
  kTrStorerHOut,      // storer: h's stores have read the slots (FC1 with h kept; else = took)
  kTrStorerActivated, // storer: the activation is in the slots (FC1; else = h out)
  kTrStorerReleased,  // storer: the slots are released (act / FC2 rows have read them)
  kTrStorerDone,      // storer: the tile is counted (FC1: its stores complete)
  kTraceSlots
};

// Per block, after the tiles: [kTraceHeader] values.
enum TraceHeader : int {
  kTrStartNs = 0,     // globaltimer at the block's start
  kTrStartClock,      // clock64 at the same point
  kTrEndNs,           // globaltimer when its first consumer warpgroup is done
  kTrEndClock,
  kTrPullEndClock,    // clock64 when its pull ended (row-pulling blocks; else 0)
  kTrTicket,          // its arrival ticket
  kTraceHeader
};

// One block's trace: its first kTiles tiles of kSlots values each, then the header.
template <int kTiles, int kSlots>
struct BlockTrace {
  static constexpr int kBlockValues = kTiles * kSlots + kTraceHeader;
  int64_t* block;  // this block's kBlockValues, or null: not tracing

  __device__ static BlockTrace make(int64_t* buffer) {
    return {buffer ? buffer + int64_t(blockIdx.x) * kBlockValues : nullptr};
  }
  // The timers are read only when tracing (they are volatile reads the compiler keeps).
  __device__ void stamp(int seq, int slot) const {
    if (block != nullptr && seq < kTiles) block[seq * kSlots + slot] = clock64();
  }
  __device__ void tile_value(int seq, int slot, int64_t value) const {
    if (block != nullptr && seq < kTiles) block[seq * kSlots + slot] = value;
  }
  __device__ void header_clock(int slot) const {
    if (block != nullptr) block[kTiles * kSlots + slot] = clock64();
  }
  __device__ void header_ns(int slot) const {
    if (block != nullptr) block[kTiles * kSlots + slot] = int64_t(globaltimer_ns());
  }
  __device__ void header_value(int slot, int64_t value) const {
    if (block != nullptr) block[kTiles * kSlots + slot] = value;
  }
};

// The forward megakernel's.
using TileTrace = BlockTrace<kTraceTiles, kTraceSlots>;
constexpr int kTraceBlockValues = TileTrace::kBlockValues;

}  // namespace mok
