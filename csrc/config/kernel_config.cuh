// Kernel constants of the GPU path (v1 kernels and the sm90 GEMM tile engine), in one place. The Python side
// mirrors the ones it needs (mok_megatron/cuda/ops.py: MAX_RANKS).
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

// Schedule (schedule/build_schedule.cu): tiles of consecutive (source, token, slot) entries,
// one block each; the scan over tiles is one block.
constexpr int kScheduleThreads = 256;
constexpr int kScheduleTileSlots = 4096;
constexpr int kScheduleScanThreads = 1024;
// Blocks per SM for the grid-stride elementwise / row kernels.
constexpr int kBlocksPerSm = 4;

// MXFP8 operand rounding (quant/mx_round.cu): elements per E8M0 scale block (OCP MX; the
// Python side's mxfp8.BLOCK) and threads per CTA.
constexpr int kMxBlock = 32;
constexpr int kMxRoundThreads = 256;

// Barrier flag channels in the workspace (one per independent signalling sequence).
constexpr int kNumBarrierChannels = 4;

static_assert(kRowThreads % 32 == 0, "row movers use whole warps");
static_assert(kMaxRanks <= 32, "a barrier uses one thread per rank inside one warp");

// Grouped GEMM tile engine (gemm/grouped_gemm.cu; sm90 TMA + wgmma, warp-specialized).
// A CTA tile is kGemmBlockM rows x kGemmBlockN columns: one producer warpgroup issues TMA,
// kGemmConsumers warpgroups each own 64 rows and run m64n256k16 MMAs. With a gated activation
// (SwiGLU/GeGLU) the 256 columns are 128 gate + the matching 128 up columns, so the epilogue
// has both halves of every output column in the same thread.
constexpr int kGemmConsumers = 2;
constexpr int kGemmWarpgroupRows = 64;  // wgmma m64: the rows one consumer owns
constexpr int kGemmBlockM = kGemmWarpgroupRows * kGemmConsumers;
constexpr int kGemmBlockN = 256;
constexpr int kGemmBlockK = 64;  // one 128-byte swizzle row of bf16
// 3 x 48 KiB of shared memory, plus 2 x 32 KiB where each consumer warpgroup stages its
// output for TMA stores (gemm/sm90/tile_epilogue.cuh): measured faster than 4 stages with
// per-thread stores on 22 of 24 grouped-GEMM cases, the other two within 3% (docs/perf-log.md).
constexpr int kGemmStages = 3;
constexpr int kGemmThreads = 128 * (1 + kGemmConsumers);
constexpr int kGemmProducerRegs = 40;
constexpr int kGemmConsumerRegs = 232;
constexpr int kGemmMaxExperts = 1024;  // local experts one launch can schedule
constexpr int kMaxDynamicSmemBytes = 227 * 1024;  // sm_90: per block, opted in

// FP8 grouped GEMM (gemm/fp8_grouped_gemm.cu, blockwise recipe): E4M3 x E4M3 wgmma
// m64n128k32 with fp32 partial sums promoted into the accumulators on the CUDA cores once per
// kFp8ScaleBlock of K (row scale x weight-block scale). A tile is kGemmBlockM x kFp8BlockN: a
// consumer holds 64 accumulators and 64 partial sums (n256 would need 256 registers). A stage
// is one 128-byte swizzle row of K (128 codes) per operand row: one scale block.
constexpr int kFp8BlockN = 128;
constexpr int kFp8BlockK = 128;
constexpr int kFp8ScaleBlock = 128;  // 1 x 128 activation blocks, 128 x 128 weight blocks
// The FP8 grouped GEMM's stage ring: the deepest of kFp8MinStages..kFp8MaxStages (32 KiB
// each) that fits beside the epilogue's staging and the launch's expert tables, and its tiles
// in groups of kFp8TileGroupMBlocks m-blocks (sm90::group_order), so one wave's CTAs share A
// and W in L2. Both are options of the call (ops.fp8_grouped_gemm: stages, m_group; the same
// bits), as are CTA pairs sharing weight tiles (cluster_ctas; gemm/fp8_grouped_gemm.cu). None
// changed the engine's rate (4-6 stages, groups of 1-16, pairs: docs/perf-log.md, Blockwise FP8, 2026-12-05): it is
// bound by its consumers' instructions per k-block.
constexpr int kFp8MinStages = 5;
constexpr int kFp8MaxStages = 6;
constexpr int kFp8TileGroupMBlocks = 8;
// The grouped GEMM's wide tiles (ops.fp8_grouped_gemm block_n; a gated tile: 96 gate and 96 up
// weight rows): m64n192 per consumer (96 accumulators and 96 partial sums), 4 stages of 40 KiB
// beside three staging boxes per consumer - the deepest ring that fits with every expert count.
constexpr int kFp8WideBlockN = 192;
constexpr int kFp8WideStages = 4;
// The forward megakernel under the blockwise recipe: 5 stages (160 KiB) do not fit beside the
// megakernel's two 33 KiB staging buffers and its expert tables; 4 do (~211 KiB in all).
constexpr int kFp8MegakernelStages = 4;
// A TMA box starts 16-byte aligned in its innermost dimension while an expert's rows start
// anywhere, so a stage's row scales ([k-block][row] E8M0 codes) come as a box of
// kFp8RowScaleBox codes from the 16-aligned row at or below the tile's first row.
constexpr int kFp8RowScaleAlign = 16;
constexpr int kFp8RowScaleBox = kGemmBlockM + kFp8RowScaleAlign;
// A plain tile's weight rows are one 128-row scale block; a gated tile's two 64-row halves lie
// inside one block each when F is a multiple of 64 (checked at the call).
static_assert(kFp8ScaleBlock == kFp8BlockK && kFp8BlockN == kFp8ScaleBlock,
              "a stage is one scale block along K, a tile's weight rows one block along N");

// Forward megakernel's row-pulling blocks: token rows go peer/local global -> shared -> row
// buffer as 1-D bulk copies, through a ring of whole-row slots carved from the GEMM stage
// memory the pulling block does not use (at most kPullMaxSlots, at least kPullMinSlots rows).
// Up to slots / kPullLanesDivisor rows (at most 32) are loaded and stored per step, so about
// half the ring is in flight as loads; rows are published per chunk of the recipe's
// minibatch_tokens rows (the overlap unit; kernel argument, not a constant).
constexpr int kPullMaxSlots = 128;
constexpr int kPullMinSlots = 4;
constexpr int kPullLanesDivisor = 4;
// Forward megakernel: tile indices the producer can take ahead of its consumers
// (megakernel/tile_queue.cuh).
constexpr int kTileQueueDepth = 4;
// Forward megakernel: m-blocks of one expert whose tiles are taken n-block by n-block, so the
// tiles reading one weight slab run together (megakernel/macrobatch_ring.cuh). Larger groups
// spread an m-block's tiles (its A rows' reuse) over more indices.
constexpr int kTileGroupMBlocks = 4;
// The standalone BF16 engine (gemm/grouped_gemm.cu): its tiles in groups of this many m-blocks
// of an expert, n-block by n-block (sm90::group_order; an option of the call, m_group). In the
// plain order (1) a layer with many n-blocks reads each weight slab once per m-block: at
// Mixtral's FC1 (112 n-blocks, 8 m-blocks per expert) all of W1, 1.9 GB, eight times - more than
// L2 can keep between them. With 8 a wave of 132 tiles reads each slab about once.
constexpr int kEngineTileGroupMBlocks = 8;
// Macrobatches one megakernel launch can walk (the backward megakernel keeps a table of them in
// shared memory: megakernel/backward_tiles.cuh); a call whose ring would need more is refused
// before anything runs (mok_megatron/cuda/symm_moe.py check_kernel_call, mirrored by
// ops.MAX_MACROBATCHES; the launcher checks again).
constexpr int kMaxMacrobatches = 256;
// Backward megakernel under the FP8 recipes: columns of one rounding tile, an m-block's 128 rows
// x this many of one operand. MXFP8 (megakernel/mx_round_tile.cuh): each of the tile's 8
// warps rounds kRoundCols / 64 units of 32 rows x 64 columns, one after another; blockwise
// (megakernel/fp8_round_tile.cuh): both consumer warpgroups round kRoundCols / 128 units of
// 128 rows x 128 columns together.
constexpr int kRoundCols = 512;
// Forward megakernel: the producer warpgroup also holds the storer warps
// (megakernel/epilogue_storer.cuh), whose FC1 activation at 40 registers ran one exp ->
// reciprocal chain at a time; consumers give up 8 registers each so it gets 16 more.
constexpr int kMegakernelProducerRegs = 56;
constexpr int kMegakernelConsumerRegs = 224;

// setmaxnreg moves registers within what the block was launched with: kGemmThreads threads at
// the most registers each that fit the SM's 64K, in steps of 8 (168 x 384 = 64512).
constexpr int kLaunchRegsPerThread = (65536 / kGemmThreads) / 8 * 8;
static_assert((kGemmProducerRegs + kGemmConsumerRegs * kGemmConsumers) * 128 <=
                      kLaunchRegsPerThread * kGemmThreads &&
                  (kMegakernelProducerRegs + kMegakernelConsumerRegs * kGemmConsumers) * 128 <=
                      kLaunchRegsPerThread * kGemmThreads,
              "setmaxnreg budgets within the registers one CTA per SM is launched with");

}  // namespace mok
