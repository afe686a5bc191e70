// Kernel constants of the v1 (separate-kernel) GPU path, in one place. The Python side
// mirrors the ones it needs (mok_megatron/ops.py: MAX_RANKS).
#pragma once

namespace mok {

// Largest expert-parallel group inside one NVLink domain that we support (one node).
constexpr int kMaxRanks = 8;

// Row movers (pull-dispatch, push-combine): one warp per row, 16-byte vectors, and this many
// vectors in flight per lane before the first store, to cover NVLink latency.
constexpr int kRowThreads = 256;
constexpr int kRowVecsInFlight = 4;
constexpr int kRowBytesAlign = 16;

// Elementwise / per-row kernels.
constexpr int kActThreads = 256;
constexpr int kReduceThreads = 256;

// Routing keys: a grid-stride loop; blocks per SM for the persistent launches.
constexpr int kKeysThreads = 256;
constexpr int kBlocksPerSm = 4;

// Barrier flag channels in the workspace (one per independent signalling sequence).
constexpr int kNumBarrierChannels = 4;

static_assert(kRowThreads % 32 == 0, "row movers use whole warps");
static_assert(kMaxRanks <= 32, "a barrier uses one thread per rank inside one warp");

}  // namespace mok
