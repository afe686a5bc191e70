// The backward megakernel's tile trace: tile_trace.cuh's BlockTrace with the backward's slots
// (benchmarks/diagnostics/trace_backward.py reads them; ops.BACKWARD_TRACE_SLOTS mirrors the
// order). Consumer warpgroup 0's leader stamps the consumer side, the producer thread its
// own, consumer 0's storer warp (lane 0) the handoffs it takes; all sides of a tile share its
// row (the queue's sequence number). Stamps a path does not pass stay 0.
#pragma once

#include "megakernel/tile_trace.cuh"

namespace mok {

// Tiles per block at T=4096: ~180 (Qwen3-30B-A3B-like, all 128 experts on one GPU), ~200
// (DeepSeek-V3-like EP64-equivalent), ~2600 (DeepSeek-V3-like's 256 experts: traced in part).
constexpr int kBackwardTraceTiles = 512;

enum BackwardTraceSlot : int {
  kBtTileStart = 0,  // consumer: before waiting for the tile's queue entry
  kBtTileQueued,     // consumer: the entry is read
  // consumer: its own waits are over and its mainloop starts - the ring's done count
  // released at a macrobatch switch, then a carried dW part: the carry's flag and its loads;
  // a rounding tile: its input's count and the warpgroups' meeting
  kBtInputsReady,
  kBtMainloopEnd,    // consumer: accumulators complete (rounding tile: its rows rounded)
  // consumer, the epilogue's steps per kind (then the count, if any, to kBtTileEnd):
  //   FC1, FC2-dgrad, FC1-dgrad  1: staging slots free (the storer's handoffs before them
  //                                 released)  2: rows staged and handed to the storer
  //   dW         1: slots free (bf16 dW) or the fp32 path begun  2: dW staged and handed
  //              on (bf16), added into main_grad (fp32) or left as a carry
  kBtEpilogue1,
  kBtEpilogue2,
  kBtTileEnd,        // consumer: its carry / an idle half counted, the tile done
  kBtTileId,         // tile index * 8 + kind (BackwardKind)
  kBtMacro,          // its macrobatch
  kBtRows,           // BackwardTile::rows (dW: the part's rows, its K)
  kBtPart,           // dW: kPartCarryIn | kPartCarryOut (backward_tiles.cuh)
  kBtProducerStart,  // producer: before taking the index ahead
  kBtTaken,          // producer: the index ahead taken (atomic round trip), this tile decoded
  kBtPushed,         // producer: queued for the consumers (a free entry waited for)
  kBtReady,          // producer: its inputs complete (acquired and fenced)
  kBtLoadsIssued,    // producer: its loads issued (its stages' empty waits included)
  kBtStorerTook,     // storer: the tile's handoff taken (its wait for it ends)
  // storer: its work made - FC1: act in the slots (h stored); FC2-dgrad: dh and the dprob
  // partials made and dh's stores issued; FC1-dgrad: the rows' stores issued, dprob summed;
  // dW: its stores issued
  kBtStorerMade,
  kBtStorerReleased, // storer: the slots released (the stores have read them)
  kBtStorerDone,     // storer: counted (FC1, FC2-dgrad: the stores complete)
  kBackwardTraceSlots
};

using BackwardTrace = BlockTrace<kBackwardTraceTiles, kBackwardTraceSlots>;

}  // namespace mok
