// The forward megakernel: pull-dispatch, FC1 with the activation x prob epilogue, FC2 and
// push-combine in one persistent launch (grid = SM count, one block per SM).
//
// Roles (by arrival: a block's ticket is its place among the blocks that have started):
//   tickets [0, comm_blocks)  first pull rows (megakernel/row_pull.cuh): token rows from the
//                             source rank's published buffer (NVLink for peers) into the row
//                             buffer in the schedule's order, counted per m-block (rows_ready,
//                             release); then they join the tiles below.
//   every block               runs tiles of the sm90 tile engine over one index space: all FC1
//                             tiles, then all FC2 tiles (order: macrobatch_ring.cuh), handed out
//                             in increasing order by a grid-wide counter (tile_queue.cuh). An
//                             FC1 tile's producer waits (acquire) until its m-block's rows are
//                             all pulled; an FC2 tile's producer waits until every FC1 tile of
//                             its m-block has stored its activation rows (fc1_done). Consumer
//                             warpgroups stage each finished tile's bf16 rows and hand them to
//                             a storer warp (epilogue_storer.cuh), which stores and counts them
//                             while the consumers run the next tile. FC2 rows go straight into
//                             their (token, k) slot on the source rank, the same slots v1's
//                             push-combine fills, so the fixed-order reduction after the kernel
//                             is unchanged.
// Deadlock freedom: every tile depends only on tiles with lower indices (or on the pull, which
// depends on nothing but, with the ring, FC2 tiles of earlier macrobatches), indices are
// handed out in increasing order, each block runs its tiles in the order it took them, and
// only running blocks hold work: tiles are taken when a block can run them and the pull
// belongs to the first blocks to start, not to fixed block indices; a tile's counts come
// from its storer, which waits only for its own stores. So the kernel needs just
// comm_blocks + 1 blocks resident, not the whole grid - kernels of other streams (NCCL,
// another rank's kernels when ranks share a GPU in tests) may hold SMs while it runs.
// Recipes (kOperands): BF16; or MXFP8 (docs/mxfp8.md), with x quantized once at its source
// and published as FP8 wire rows that the pull dequantizes into bf16 rows of MXFP8 values
// (megakernel/row_pull.cuh: one byte per element over NVLink), act rounded along F by the
// storer before
// it is stored, and the weights either as their MXFP8 values in bf16 (rounded once per
// optimizer step) or as E4M3 codes with E8M0 scales that the consumers dequantize per stage in
// shared memory (gemm/sm90/mx_weight_stage.cuh, as grouped_gemm.cu does) - the same bits as
// the separate path's FC1 and FC2 under the recipe. Blockwise FP8 (docs/fp8_blockwise.md):
// the pull copies x's wire rows as they are - E4M3 codes and the transposed 1 x 128 scale
// codes, the FP8 engine's A operand (row_pull.cuh: pull_wire_codes_bulk) - and every tile is
// the FP8 engine's (gemm/sm90/fp8_mainloop.cuh: 128 x 128 tiles, 128 of K per stage, partial
// sums promoted once per stage). An FC1 tile makes kFp8ScaleBlock activation columns, one
// 1 x 128 block of each row (gated: two passes of 64 gate + 64 up weight rows), which the
// storer quantizes into act's codes and scale codes (epilogue_storer.cuh: store_fp8_act) - the
// operands the separate path's fp8_quantize_rows gives its FC2, so y is its y bit for bit.
// Memory ordering: rows and activations are written by TMA / bulk stores (async proxy; an
// expert's partial last block of activations and dequantized wire rows by plain stores,
// fenced before the release) and read by TMA in another
// block: writer waits for its stores to complete -> fence.proxy.async -> release counter;
// reader acquire -> fence.proxy.async.global -> TMA load.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <algorithm>
#include <type_traits>

#include "common/error.cuh"
#include "common/ptx.cuh"
#include "gemm/mx_weight_checks.h"
#include "gemm/persistent_launch.cuh"
#include "gemm/sm90/fp8_mainloop.cuh"
#include "gemm/sm90/mx_weight_stage.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/timeout_report.h"
#include "megakernel/epilogue_storer.cuh"
#include "megakernel/launch_checks.h"
#include "megakernel/macrobatch_ring.cuh"
#include "megakernel/row_pull.cuh"
#include "megakernel/tile_queue.cuh"
#include "megakernel/tile_trace.cuh"
#include "ops.h"

namespace mok {
namespace {

using namespace sm90;

struct ForwardArgs {
  const int64_t* peer_bases;  // [world] address of each rank's workspace
  int64_t tokens_offset;      // byte offset of the published token rows [max_tokens, H]
  WireRow wire;               // their layout under an FP8 recipe (row_bytes 0: bf16 rows)
  int64_t slots_offset;       // byte offset of the combine slots [max_tokens * topk, H]
  const int32_t* offsets;     // [E + 1] expert row ranges in the row buffer
  const int32_t* row_slot;    // [rows] flat (source, token, k) of each row
  const float* row_prob;      // [rows]
  int num_experts, hidden, ffn, per_rank, topk, comm_blocks, world;
  __nv_bfloat16* rows;        // [cap or ring rows, H]  pulled token rows
  __nv_bfloat16* act;         // [cap or ring rows, F]  act(h) * prob
  __nv_bfloat16* h_out;       // [h_rows, F1] FC1 output of the first schedule rows for
                              // backward, or null: not kept
  int h_rows;
  uint32_t* rows_ready;       // [m-blocks] rows pulled
  uint32_t* fc1_done;         // [m-blocks] FC1 tile halves stored (one per consumer)
  uint32_t* fc2_done;         // [macrobatches] FC2 tile halves done reading act
  int ring_mblocks, ring_slots;  // macrobatch_ring.cuh (ring_mblocks 0: no ring)
  int minibatch_rows;         // rows the pull publishes at once
  uint32_t* tile_counter;     // [1] tiles handed out (tile_queue.cuh)
  uint32_t* arrivals;         // [1] blocks started (their tickets)
  uint64_t timeout_ns;
  int* report;
  int skip;                   // ProfileSkip bits: stages left out, for timing only
  int64_t* trace;             // [grid, kTraceBlockValues] timestamps (tile_trace.cuh), or null
  // Blockwise FP8 only (rows and act then unused): the pulled rows' and act's codes and scale
  // codes, and each weight's E8M0 codes per 128 x 128 block [E, row_blocks, k_blocks].
  Fp8Rows rows_fp8, act_fp8;
  const uint8_t* w1_block_scales;
  const uint8_t* w2_block_scales;
  int w1_row_blocks, w2_row_blocks;
};

// What the GEMMs read (the file's comment: Recipes).
enum ForwardOperands : int {
  kBf16Operands = 0,
  kMxfp8Values = 1,
  kMxfp8Codes = 2,
  kFp8Blockwise = 3
};

using Fp8Ring = Fp8StageRing<Fp8BlockScales, kFp8MegakernelStages>;
struct NoMxScales {};

// kFp8: the blockwise recipe's stage ring (FP8 engine), else the tile engine's.
template <bool kFp8>
struct SharedStorage {
  using Ring = std::conditional_t<kFp8, Fp8Ring, StageRing>;
  EpilogueBuffers epilogue;  // first: 1024-aligned, as TMA's 128-byte swizzle needs
  Ring ring;
  std::conditional_t<kFp8, NoMxScales, MxScaleRing> mx_scales;  // kMxfp8Codes only
  int32_t row_begin[kGemmMaxExperts + 1];
  int32_t mblock_begin[kGemmMaxExperts + 1];
  uint64_t pull_full[kPullMaxSlots];  // row-pulling blocks: their slots live in epilogue
  uint64_t pull_empty[kPullMaxSlots];  // and ring.a/b until their pull is done
  TileQueue<QueuedTile> queue;
  StagingHandoff<> handoff[kGemmConsumers];  // consumer warpgroup -> its storer warp
  StorerTargets storer_targets;  // read by the storers in place (epilogue_storer.cuh)
  uint32_t ticket;  // this block's arrival ticket
};
template <bool kFp8>
constexpr size_t kSharedBytes = aligned_smem_bytes<SharedStorage<kFp8>>();
// The pull's slots span epilogue, ring.a and ring.b (row_pull.cuh: pull_bytes).
template <bool kFp8>
constexpr size_t kPullRingBytes = pull_bytes<typename SharedStorage<kFp8>::Ring>();
static_assert(offsetof(SharedStorage<false>, ring) == sizeof(EpilogueBuffers) &&
                  offsetof(SharedStorage<true>, ring) == sizeof(EpilogueBuffers) &&
                  offsetof(Fp8Ring, a) == 0 && offsetof(Fp8Ring, b) == sizeof(Fp8Ring::a),
              "the pull's slots: epilogue, ring.a and ring.b back to back");
static_assert(kSharedBytes<false> <= kMaxDynamicSmemBytes &&
                  kSharedBytes<true> <= kMaxDynamicSmemBytes,
              "shared memory of one block per SM");

// Stages a profiling run leaves out (docs/perf-log.md: "time variants with a stage
// removed"); any bit set makes the results meaningless, only the time counts.
// kSkipStores: the epilogues compute but store nothing (FC1 tiles are still counted).
// kSkipMma / kSkipLoads split a mainloop into its two sides: the stages move through the ring
// without MMAs reading them, or are marked full without loads writing them.
enum ProfileSkip : int {
  kSkipPull = 1,
  kSkipWaits = 2,
  kSkipFc1 = 4,
  kSkipFc2 = 8,
  kSkipStores = 16,
  kSkipMma = 32,
  kSkipLoads = 64
};

// kDiagnostic: the kernel for profiling variants (a.skip) and traces (a.trace,
// tile_trace.cuh). The production kernel has neither: their code costs registers (the
// producer warpgroup runs on kMegakernelProducerRegs) and spills even where it never runs.
template <int kAct, bool kDiagnostic, int kOperands>
__global__ void __launch_bounds__(kGemmThreads, 1)
    moe_forward_kernel(const __grid_constant__ CUtensorMap rows_map,
                       const __grid_constant__ CUtensorMap w1_map,
                       const __grid_constant__ CUtensorMap act_map,
                       const __grid_constant__ CUtensorMap w2_map,
                       const __grid_constant__ CUtensorMap w1_scales_map,
                       const __grid_constant__ CUtensorMap w2_scales_map,
                       const __grid_constant__ CUtensorMap act_store_map,
                       const __grid_constant__ CUtensorMap h_store_map,
                       const __grid_constant__ CUtensorMap rows_scales_map,
                       const __grid_constant__ CUtensorMap act_scales_map, const ForwardArgs a) {
  constexpr bool kGated = gated_epilogue<kAct>();
  constexpr bool kCodes = kOperands == kMxfp8Codes;
  constexpr bool kFp8 = kOperands == kFp8Blockwise;
  // Blockwise: an FC1 tile is one 1 x 128 block of act per row, made in kFc1Passes passes of
  // the FP8 engine's 128 weight rows (gated: 64 gate + 64 up each).
  constexpr int kFc1Cols = kFp8 ? kFp8ScaleBlock : tile_cols<kAct>();
  constexpr int kFc1Passes = kFp8 && kGated ? 2 : 1;
  constexpr int kFc2Cols = kFp8 ? kFp8BlockN : kGemmBlockN;
  constexpr int kBlockK = kFp8 ? kFp8BlockK : kGemmBlockK;
  constexpr int kActForm = kFp8 ? kActFp8Codes : kOperands != kBf16Operands ? kActMxRounded
                                                                             : kActBf16;
  extern __shared__ uint8_t smem_raw[];
  SharedStorage<kFp8>& s = aligned_smem<SharedStorage<kFp8>>(smem_raw);
  const int skip = kDiagnostic ? a.skip : 0;
  int64_t* const trace_buffer = kDiagnostic ? a.trace : nullptr;

  const int E = a.num_experts;
  const int fc1_nblocks = (a.ffn + kFc1Cols - 1) / kFc1Cols;
  const int fc2_nblocks = (a.hidden + kFc2Cols - 1) / kFc2Cols;
  if (threadIdx.x < 32) {
    build_mblock_table(a.offsets, E, s.row_begin, s.mblock_begin);
  }
  const int slots =
      pull_slots(a.wire.row_bytes > 0 ? a.wire.row_bytes : 2 * a.hidden, kPullRingBytes<kFp8>);
  const PullRing pull_ring{s.epilogue.out[0], s.pull_full, s.pull_empty, slots,
                           min(32, max(1, slots / kPullLanesDivisor))};
  if (threadIdx.x == 32) {
    const TileTrace block_trace = TileTrace::make(trace_buffer);
    block_trace.header_ns(kTrStartNs);
    block_trace.header_clock(kTrStartClock);
    s.ticket = atomicAdd(a.arrivals, 1u);
    block_trace.header_value(kTrTicket, s.ticket);
    // The stage ring's and the queue's barriers do not overlap the pull's slots.
    if (s.ticket < a.comm_blocks) init_pull_ring(pull_ring);
    init_tile_queue(s.queue);
    for (int c = 0; c < kGemmConsumers; ++c) init_staging_handoff(s.handoff[c]);
    if constexpr (kFp8) init_fp8_ring(s.ring);
    else init_ring(s.ring);
    s.storer_targets = StorerTargets{a.row_prob, &act_store_map, &h_store_map, a.act, a.h_out,
                                     a.h_rows, a.ffn, kGated ? 2 * a.ffn : a.ffn, a.hidden,
                                     a.row_slot, a.peer_bases, a.slots_offset, a.per_rank,
                                     a.fc1_done, a.fc2_done, a.timeout_ns, a.report,
                                     a.act_fp8};
  }
  __syncthreads();
  const int ticket = static_cast<int>(s.ticket);
  const MacrobatchRing ring =
      MacrobatchRing::make(a.ring_mblocks, a.ring_slots, s.mblock_begin[E]);
  const MBlockTable table{s.row_begin, s.mblock_begin, E};

  if (ticket < a.comm_blocks) {
    if (!(skip & kSkipPull)) {
      const RowPlacement placement{ring,
                                   table,
                                   a.minibatch_rows,
                                   a.fc2_done,
                                   fc2_nblocks * kGemmConsumers,
                                   nullptr,
                                   !(skip & (kSkipFc2 | kSkipWaits)),
                                   a.timeout_ns,
                                   a.report};
      const RowSource src{a.peer_bases, a.row_slot, a.per_rank, a.topk, a.world};
      if constexpr (kFp8) {
        pull_wire_codes_bulk(src, a.tokens_offset, a.wire, a.hidden, a.rows_fp8, ticket,
                             a.comm_blocks, pull_ring, placement, a.rows_ready);
      } else if (a.wire.row_bytes > 0) {
        pull_wire_rows_bulk(src, a.tokens_offset, a.wire, a.hidden, a.rows, ticket,
                            a.comm_blocks, pull_ring, placement, a.rows_ready);
      } else {
        pull_rows_bulk(src, RowStreams{{a.tokens_offset, 0}, {a.rows, nullptr}, 1}, a.hidden,
                       ticket, a.comm_blocks, pull_ring, placement, a.rows_ready);
      }
    }
    // Its rows are pulled (every slot's bulk store has completed): the block's shared memory
    // is free, and it joins the GEMM tiles below.
    __syncthreads();
    if (threadIdx.x == 0) TileTrace::make(trace_buffer).header_clock(kTrPullEndClock);
  }

  const int end_tile = ring.mblocks * (fc1_nblocks + fc2_nblocks);
  const bool wait_rows = !(skip & (kSkipPull | kSkipWaits));
  const bool wait_fc1 = !(skip & (kSkipFc1 | kSkipWaits));
  const int fc1_kblocks = (a.hidden + kBlockK - 1) / kBlockK;
  const int fc2_kblocks = (a.ffn + kBlockK - 1) / kBlockK;

  auto locate = [&](int tile) {
    const PhaseTile pt = tile_at(ring, table, fc1_nblocks, fc2_nblocks, tile);
    QueuedTile w;
    w.tile = tile;
    w.fc1 = pt.fc1;
    w.mblock = pt.mblock;
    w.n_block = pt.n_block;
    w.expert = pt.expert;
    w.row0 = table.first_row(pt.mblock, w.expert);
    w.slot0 = ring.on ? static_cast<int>(ring.slot_row0(pt.mblock)) : w.row0;
    w.rows_left = s.row_begin[w.expert + 1] - w.row0;
    return w;
  };
  // Profiling variants leave FC1 or FC2 tiles out: the producer passes over them (only those
  // runs decode a tile here).
  const bool skip_phase = skip & (kSkipFc1 | kSkipFc2);
  auto skipped = [&](int tile) {
    const bool fc1 = phase_run(ring, fc1_nblocks, fc2_nblocks, tile).fc1;
    return (skip & (fc1 ? kSkipFc1 : kSkipFc2)) != 0;
  };
  // They pass over a run of the other phase's tiles at once: taking them one atomic each put
  // thousands of serialized atomics into the variant's time (docs/perf-log.md, clock64
  // stamps). atomicMax only moves the counter to the end of a run that is skipped anyway.
  auto take = [&]() {
    int tile = take_tile(a.tile_counter, end_tile);
    while (skip_phase && tile >= 0 && skipped(tile)) {
      atomicMax(a.tile_counter, uint32_t(phase_run(ring, fc1_nblocks, fc2_nblocks, tile).end));
      tile = take_tile(a.tile_counter, end_tile);
    }
    return tile;
  };

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    warpgroup_reg_dealloc<kMegakernelProducerRegs>();
    const int warp = threadIdx.x / 32;
    if (warp >= 1 && warp <= kGemmConsumers) {
      // Warp c + 1 stores what consumer warpgroup c stages (epilogue_storer.cuh).
      const TileTrace storer_trace = warp == 1 && threadIdx.x % 32 == 0
                                         ? TileTrace::make(trace_buffer)
                                         : TileTrace{nullptr};
      run_storer<kAct, kActForm>(s.handoff[warp - 1], s.epilogue.out[warp - 1],
                                 s.storer_targets, storer_trace);
      return;
    }
    if (threadIdx.x != 0) return;
    int it = 0;
    // One index is taken ahead, so the atomic's round trip overlaps this tile's loads instead
    // of leaving the stage ring empty between tiles (holding it keeps the order argument:
    // the block runs it next, after lower tiles only).
    const TileTrace trace = TileTrace::make(trace_buffer);
    int ahead = take();
    for (int seq = 0;; ++seq) {
      trace.stamp(seq, kTrProducerStart);
      const int tile = ahead;
      if (tile < 0) {
        push_tile(s.queue, seq, QueuedTile{-1}, a.timeout_ns, a.report);
        break;
      }
      ahead = take();
      const QueuedTile w = locate(tile);
      push_tile(s.queue, seq, w, a.timeout_ns, a.report);
      trace.stamp(seq, kTrPushed);
      if (w.fc1 && wait_rows) {
        counter_wait(&a.rows_ready[w.mblock], min(w.rows_left, kGemmBlockM), a.timeout_ns,
                     kWaitRowsReady, tile, w.mblock, a.report);
      } else if (!w.fc1 && wait_fc1) {
        counter_wait(&a.fc1_done[w.mblock], fc1_nblocks * kGemmConsumers, a.timeout_ns,
                     kWaitFc1Done, tile, w.mblock, a.report);
      }
      fence_proxy_async_global();
      trace.stamp(seq, kTrReady);
      if constexpr (kFp8) {
        if (w.fc1) {
          // Pass p: the weight rows of activation columns n0 .. n0 + 63 (gated) or all 128.
          const Fp8Weights w1{a.w1_block_scales, a.w1_row_blocks, a.ffn};
          for (int pass = 0; pass < kFc1Passes; ++pass) {
            produce_fp8_tile<kGated>(s.ring, it, fc1_kblocks, tile, &rows_map, &rows_scales_map,
                                     &w1_map, w1, w.slot0,
                                     w.n_block * kFc1Cols + pass * (kFp8BlockN / 2),
                                     w.expert, a.timeout_ns, a.report);
          }
        } else {
          const Fp8Weights w2{a.w2_block_scales, a.w2_row_blocks, a.hidden};
          produce_fp8_tile<false>(s.ring, it, fc2_kblocks, tile, &act_map, &act_scales_map,
                                  &w2_map, w2, w.slot0, w.n_block * kFc2Cols, w.expert,
                                  a.timeout_ns, a.report);
        }
        trace.stamp(seq, kTrLoadsIssued);
      } else {
        const int k_blocks = w.fc1 ? fc1_kblocks : fc2_kblocks;
        if (skip & kSkipLoads) {
          signal_tile(s.ring, it, k_blocks, tile, a.timeout_ns, a.report);
          trace.stamp(seq, kTrLoadsIssued);
          continue;
        }
        produce_tile(s.ring, it, k_blocks, tile, a.timeout_ns, a.report, [&](int stage, int k0) {
          uint64_t* full = &s.ring.full[stage];
          uint8_t* b = s.ring.b[stage];
          if (w.fc1) {
            tma_load_4d(s.ring.a[stage], &rows_map, full, k0, w.slot0, 0, 0);
            if constexpr (kCodes) {
              load_weight_codes<kGated>(b, s.mx_scales.codes[stage], &w1_map, &w1_scales_map,
                                        full, k0, w.n_block * kFc1Cols, w.expert);
            } else {
              load_weight_tile<kGated>(b, &w1_map, full, k0, w.n_block * kFc1Cols, w.expert);
            }
          } else {
            tma_load_4d(s.ring.a[stage], &act_map, full, k0, w.slot0, 0, 0);
            if constexpr (kCodes) {
              load_weight_codes<false>(b, s.mx_scales.codes[stage], &w2_map, &w2_scales_map,
                                       full, k0, w.n_block * kGemmBlockN, w.expert);
            } else {
              load_weight_tile<false>(b, &w2_map, full, k0, w.n_block * kGemmBlockN, w.expert);
            }
          }
        }, kCodes ? kMxStageTxBytes : kStageBytes);
        trace.stamp(seq, kTrLoadsIssued);
      }
    }
    return;
  }

  warpgroup_reg_alloc<kMegakernelConsumerRegs>();
  const int consumer = warpgroup - 1;
  const int t_in_wg = threadIdx.x % 128;
  const bool leader = t_in_wg == 0;
  StagingWriter<> staging{&s.handoff[consumer], s.epilogue.out[consumer], 0, leader};
  // Rows of tile t this warpgroup owns (of its 64).
  auto rows_valid = [&](const QueuedTile& t) {
    return max(0, min(kStagedRows, t.rows_left - kStagedRows * consumer));
  };
  // The first consumer warpgroup's leader stamps the consumer side.
  const TileTrace trace =
      leader && consumer == 0 ? TileTrace::make(trace_buffer) : TileTrace{nullptr};
  float acc[kFp8 ? kFp8AccRegs : kAccRegs];
  // Weight codes: both consumer warpgroups dequantize every stage together (FC1's tile as
  // gate | up halves when gated), so a warpgroup without rows still converts its share.
  const MxWeightStage<kGated> fc1_codes;
  const MxWeightStage<false> fc2_codes;
  int it = 0;
  for (int seq = 0;; ++seq) {
    trace.stamp(seq, kTrTileStart);
    const QueuedTile& t = wait_tile(s.queue, seq, a.timeout_ns, a.report);
    if (t.tile < 0) break;
    trace.stamp(seq, kTrTileQueued);
    trace.tile_value(seq, kTrTileId, int64_t(t.tile) * 2 + (t.fc1 ? 1 : 0));
    // A tile of at most 64 rows (an expert's short last m-block) is the first warpgroup's
    // alone: the second one runs no MMAs and stores nothing, so the tile costs about half.
    const bool idle = rows_valid(t) == 0;
    if constexpr (kFp8) {
      const int nvalid = rows_valid(t);
      if (t.fc1) {
        // Each pass's h (64 gate | 64 up columns, or the plain tile's 128) as bf16 into slot
        // `pass`, the rounding the activation starts from; the storer makes act's codes of the
        // tile's 128 columns from them and counts the m-block in fc1_done.
        uint8_t* slots = nullptr;
        for (int pass = 0; pass < kFc1Passes; ++pass) {
          if (idle) {
            pass_fp8_tile(s.ring, it, fc1_kblocks, t.tile, leader, kStagingBarrier + consumer,
                          a.timeout_ns, a.report);
            continue;
          }
          consume_fp8_tile(s.ring, it, fc1_kblocks, t.tile, consumer, leader, t.slot0, acc,
                           a.timeout_ns, a.report);
          if (pass == 0) slots = staging.acquire(2, t.tile, a.timeout_ns, a.report);
          write_staged_rounded<kFp8BlockN>(slots + pass * kStagedSlotBytes, t_in_wg, acc);
        }
        trace.stamp(seq, kTrMainloopEnd);
        const StagedRecord r{kStagedFc1, 2, !idle, t.slot0 + kStagedRows * consumer,
                             t.row0 + kStagedRows * consumer, nvalid,
                             t.rows_left >= kStagedRows * (consumer + 1), t.n_block * kFc1Cols,
                             t.mblock};
        if (!idle) {
          staging.hand_off(r);
        } else {
          staging.hand_off_record(r, t.tile, a.timeout_ns, a.report);
        }
      } else {
        if (idle) {
          pass_fp8_tile(s.ring, it, fc2_kblocks, t.tile, leader, kStagingBarrier + consumer,
                        a.timeout_ns, a.report);
        } else {
          consume_fp8_tile(s.ring, it, fc2_kblocks, t.tile, consumer, leader, t.slot0, acc,
                           a.timeout_ns, a.report);
        }
        trace.stamp(seq, kTrMainloopEnd);
        const StagedRecord r{kStagedFc2, 2, !idle, t.row0 + kStagedRows * consumer, 0, nvalid,
                             0, t.n_block * kFc2Cols, ring.macro_of(t.mblock)};
        if (!idle) {
          write_scatter_staged<kFc2Cols>(acc, staging.acquire(2, t.tile, a.timeout_ns, a.report),
                                         t_in_wg);
          staging.hand_off(r);
        } else {
          staging.hand_off_record(r, t.tile, a.timeout_ns, a.report);
        }
      }
    } else {
      const int k_blocks = t.fc1 ? fc1_kblocks : fc2_kblocks;
      if (skip & kSkipMma) {
        pass_tile(s.ring, it, k_blocks, t.tile, leader, kStagingBarrier + consumer, a.timeout_ns,
                  a.report);
      } else if constexpr (kCodes) {
        if (idle && t.fc1) {
          convert_only_tile(s.ring, s.mx_scales, it, k_blocks, t.tile, leader, fc1_codes,
                            a.timeout_ns, a.report);
        } else if (idle) {
          convert_only_tile(s.ring, s.mx_scales, it, k_blocks, t.tile, leader, fc2_codes,
                            a.timeout_ns, a.report);
        } else if (t.fc1) {
          consume_tile(s.ring, it, k_blocks, t.tile, consumer, leader, acc, a.timeout_ns, a.report,
                       [&](int, int stage) {
                         fc1_codes.convert(s.ring.b[stage], s.mx_scales.codes[stage]);
                       });
        } else {
          consume_tile(s.ring, it, k_blocks, t.tile, consumer, leader, acc, a.timeout_ns, a.report,
                       [&](int, int stage) {
                         fc2_codes.convert(s.ring.b[stage], s.mx_scales.codes[stage]);
                       });
        }
      } else if (idle) {
        pass_tile(s.ring, it, k_blocks, t.tile, leader, kStagingBarrier + consumer, a.timeout_ns,
                  a.report);
      } else {
        consume_tile(s.ring, it, k_blocks, t.tile, consumer, leader, acc, a.timeout_ns, a.report);
      }
      trace.stamp(seq, kTrMainloopEnd);
      const bool stores = !idle && !(skip & kSkipStores);
      const int nvalid = rows_valid(t);
      if (t.fc1) {
        // h (gate | up) as bf16, the rounding the activation starts from; the storer computes
        // act(h) * prob from it, stores both and counts the m-block in fc1_done.
        const StagedRecord r{kStagedFc1, 2, stores, t.slot0 + kStagedRows * consumer,
                             t.row0 + kStagedRows * consumer, nvalid,
                             t.rows_left >= kStagedRows * (consumer + 1), t.n_block * kFc1Cols,
                             t.mblock};
        if (stores) {
          write_staged_rounded<kGemmBlockN>(staging.acquire(2, t.tile, a.timeout_ns, a.report),
                                            t_in_wg, acc);
          staging.hand_off(r);
        } else {
          staging.hand_off_record(r, t.tile, a.timeout_ns, a.report);
        }
      } else {
        // The storer counts fc2_done (this warpgroup's MMAs have read the act rows) and sends
        // each row to its (token, k) slot on the source rank.
        const StagedRecord r{kStagedFc2, 2, stores, t.row0 + kStagedRows * consumer, 0, nvalid, 0,
                             t.n_block * kGemmBlockN, ring.macro_of(t.mblock)};
        if (stores) {
          write_scatter_staged(acc, staging.acquire(2, t.tile, a.timeout_ns, a.report), t_in_wg);
          staging.hand_off(r);
        } else {
          staging.hand_off_record(r, t.tile, a.timeout_ns, a.report);
        }
      }
    }
    trace.stamp(seq, kTrStaged);
    release_tile(s.queue, seq);
    trace.stamp(seq, kTrTileEnd);
  }
  staging.hand_off_record(StagedRecord{kStagedEnd, 1}, -1, a.timeout_ns, a.report);
  trace.header_ns(kTrEndNs);
  trace.header_clock(kTrEndClock);
}

// Blockwise: rows and act are their codes (fp8_row_tile_map), act_store act's staged codes
// (fp8_staged_codes_map), rows_scales and act_scales their scale codes; the other recipes
// leave those two empty.
struct ForwardMaps {
  CUtensorMap rows, w1, act, w2, w1_scales, w2_scales, act_store, h_store, rows_scales,
      act_scales;
};

template <int kAct, bool kDiagnostic, int kOperands>
void launch_kernel(const ForwardMaps& m, const ForwardArgs& args) {
  launch_persistent(moe_forward_kernel<kAct, kDiagnostic, kOperands>,
                    kSharedBytes<kOperands == kFp8Blockwise>, m.rows, m.w1, m.act, m.w2,
                    m.w1_scales, m.w2_scales, m.act_store, m.h_store, m.rows_scales,
                    m.act_scales, args);
}

// The blockwise recipe's diagnostic kernel records traces only (the launcher refuses its
// profiling variants: its mainloops have no skipping paths).
template <int kAct, bool kDiagnostic>
void launch_forward(ForwardOperands operands, const ForwardMaps& m, const ForwardArgs& args) {
  switch (operands) {
    case kBf16Operands: launch_kernel<kAct, kDiagnostic, kBf16Operands>(m, args); break;
    case kMxfp8Values: launch_kernel<kAct, kDiagnostic, kMxfp8Values>(m, args); break;
    case kMxfp8Codes: launch_kernel<kAct, kDiagnostic, kMxfp8Codes>(m, args); break;
    case kFp8Blockwise: launch_kernel<kAct, kDiagnostic, kFp8Blockwise>(m, args); break;
  }
}

CUtensorMap rows_tensor_map(const at::Tensor& t) {
  return row_tile_map(t.data_ptr(), t.size(0), t.size(1), t.stride(0));
}

// A bf16 weight, or with `scales` its MXFP8 codes (and the scales' map into `scales_map`).
CUtensorMap weight_tensor_map(const at::Tensor& w, int halves,
                              const c10::optional<at::Tensor>& scales, CUtensorMap& scales_map) {
  if (!scales) {
    scales_map = CUtensorMap{};
    return expert_weight_map(w.data_ptr(), w.size(0), w.size(1), w.size(2), w.stride(0),
                             w.stride(1), halves);
  }
  scales_map = expert_weight_scales_map(scales->data_ptr(), w.size(0), scales->size(1), halves,
                                        w.size(1) / halves, scales->size(3));
  return expert_weight_codes_map(w.data_ptr(), w.size(0), w.size(1), w.size(2), w.stride(0),
                                 w.stride(1), halves);
}

}  // namespace

void moe_forward_megakernel(const at::Tensor& peer_bases, int64_t tokens_offset,
                            int64_t slots_offset, const at::Tensor& offsets,
                            const at::Tensor& row_slot, const at::Tensor& row_prob,
                            int64_t max_tokens, int64_t topk, const at::Tensor& w1,
                            const at::Tensor& w2, const c10::optional<at::Tensor>& w1_scales,
                            const c10::optional<at::Tensor>& w2_scales,
                            const std::string& precision, int64_t wire_row_bytes,
                            int64_t wire_code_bytes, int64_t wire_block, int64_t activation,
                            at::Tensor& rows, at::Tensor& act,
                            const c10::optional<at::Tensor>& rows_scales,
                            const c10::optional<at::Tensor>& act_scales,
                            const c10::optional<at::Tensor>& h_out,
                            at::Tensor& counters, int64_t comm_blocks, int64_t minibatch_rows,
                            int64_t ring_mblocks, int64_t ring_slots, int64_t timeout_ns,
                            int64_t rank, int64_t profile_skip,
                            const c10::optional<at::Tensor>& trace) {
  const int64_t E = w1.size(0), H = rows.size(1), F = w2.size(2);
  const bool gated = is_gated(static_cast<int>(activation));
  const int64_t F1 = gated ? 2 * F : F;
  const int64_t cap = row_slot.numel();  // schedule rows (worst case)
  const int64_t max_mblocks = max_schedule_mblocks(cap, E);
  const bool ring_on = ring_mblocks > 0;
  const RingSize ring = RingSize::of(cap, max_mblocks, ring_mblocks, ring_slots);
  const int64_t max_macro = ring.macrobatches, buffer_rows = ring.buffer_rows;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  check_megakernel_call("moe_forward_megakernel", w1, w2, offsets, peer_bases, H, F1,
                        minibatch_rows);
  const bool mxfp8 = precision == "mxfp8", blockwise = precision == "fp8_blockwise";
  MOK_HOST_CHECK(mxfp8 || blockwise || precision == "bf16",
                 "moe_forward_megakernel: precision must be bf16, mxfp8 or fp8_blockwise, got ",
                 precision);
  MOK_HOST_CHECK((wire_row_bytes > 0) == (mxfp8 || blockwise),
                 "moe_forward_megakernel: the FP8 recipes pull FP8 wire rows (x's codes), and "
                 "only they do");
  if (wire_row_bytes > 0) {
    check_wire_row("moe_forward_megakernel", wire_row_bytes, wire_code_bytes, wire_block, H);
    const size_t pull_bytes = blockwise ? kPullRingBytes<true> : kPullRingBytes<false>;
    MOK_HOST_CHECK(pull_slots(static_cast<int>(wire_row_bytes), pull_bytes) >= kPullMinSlots,
                   "moe_forward_megakernel: wire rows of ", wire_row_bytes,
                   " bytes are too wide for the row-pulling ring");
  }
  const bool codes = w1_scales.has_value();
  MOK_HOST_CHECK(w2_scales.has_value() == codes && (blockwise ? codes : !codes || mxfp8),
                 "moe_forward_megakernel: weight scales come for both weights, under mxfp8 "
                 "(codes) or fp8_blockwise (always)");
  MOK_HOST_CHECK(rows_scales.has_value() == blockwise && act_scales.has_value() == blockwise,
                 "moe_forward_megakernel: rows_scales and act_scales come with fp8_blockwise, "
                 "and only with it");
  if (blockwise) {
    check_fp8_block_weight("moe_forward_megakernel", w1, *w1_scales);
    check_fp8_block_weight("moe_forward_megakernel", w2, *w2_scales);
    MOK_HOST_CHECK(wire_block == kFp8ScaleBlock,
                   "moe_forward_megakernel: fp8_blockwise pulls wire rows of 1 x ",
                   kFp8ScaleBlock, " blocks, got blocks of ", wire_block);
    MOK_HOST_CHECK(!gated || F % (kFp8BlockN / 2) == 0,
                   "moe_forward_megakernel: fp8_blockwise with a gated activation needs F a "
                   "multiple of ", kFp8BlockN / 2, " (each 64-row half of W1 inside one 128-row "
                   "scale block), got F = ", F);
    MOK_HOST_CHECK(profile_skip == 0,
                   "moe_forward_megakernel: fp8_blockwise has no profiling variants (traces "
                   "only)");
  } else if (codes) {
    check_mx_weight("moe_forward_megakernel", w1, *w1_scales, gated ? 2 : 1);
    check_mx_weight("moe_forward_megakernel", w2, *w2_scales, 1);
  } else {
    MOK_HOST_CHECK(w1.scalar_type() == at::kBFloat16 && w2.scalar_type() == at::kBFloat16,
                   "moe_forward_megakernel: W1 and W2 must be bf16 (or, with scales, MXFP8 "
                   "codes)");
  }
  MOK_HOST_CHECK(!ring_on || ring_slots >= 2,
                 "moe_forward_megakernel: the macrobatch ring needs >= 2 slots, got ", ring_slots,
                 " slots");
  MOK_HOST_CHECK(blockwise ||
                     (rows.is_contiguous() && act.is_contiguous() &&
                      rows.scalar_type() == at::kBFloat16 && act.scalar_type() == at::kBFloat16 &&
                      rows.size(0) >= buffer_rows && act.size(0) == rows.size(0) &&
                      act.size(1) == F),
                 "moe_forward_megakernel: rows [>= ", buffer_rows, ", H], act [rows, F], "
                 "contiguous bf16");
  // h of every schedule row (saved backward inputs), or with the ring of the first rows.
  MOK_HOST_CHECK(!h_out || (h_out->is_contiguous() && h_out->scalar_type() == at::kBFloat16 &&
                            h_out->size(1) == F1 && h_out->size(0) >= 1 &&
                            (ring_on ? h_out->size(0) <= cap : h_out->size(0) == cap)),
                 "moe_forward_megakernel: h_out must be contiguous bf16 [", cap, ", ", F1,
                 "] (with the ring: [<= ", cap, ", ", F1, "])");
  MOK_HOST_CHECK(counters.scalar_type() == at::kInt && counters.is_contiguous() &&
                     counters.numel() >= 2 * max_mblocks + max_macro + 2,
                 "moe_forward_megakernel: counters must be int32 with >= ",
                 2 * max_mblocks + max_macro + 2, " zeros");
  // Without pulling (a profiling variant) no block needs to be a comm block.
  const int64_t min_comm = (profile_skip & kSkipPull) ? 0 : 1;
  MOK_HOST_CHECK(comm_blocks >= min_comm && comm_blocks < sms,
                 "moe_forward_megakernel: comm_blocks ", comm_blocks, " must be in [", min_comm,
                 ", ", sms - 1, "]");
  MOK_HOST_CHECK(profile_skip >= 0 && profile_skip < 128,
                 "moe_forward_megakernel: profile_skip is a 7-bit mask");
  MOK_HOST_CHECK(!trace || (trace->is_cuda() && trace->scalar_type() == at::kLong &&
                              trace->is_contiguous() &&
                              trace->numel() >= int64_t(sms) * kTraceBlockValues),
                 "moe_forward_megakernel: trace must be a contiguous int64 GPU tensor of >= ",
                 int64_t(sms) * kTraceBlockValues, " values");
  c10::cuda::CUDAGuard guard(rows.device());

  ForwardArgs args{};
  args.peer_bases = peer_bases.data_ptr<int64_t>();
  args.tokens_offset = tokens_offset;
  args.wire = WireRow{static_cast<int>(wire_row_bytes), static_cast<int>(wire_code_bytes),
                      static_cast<int>(wire_block)};
  args.slots_offset = slots_offset;
  args.offsets = offsets.data_ptr<int32_t>();
  args.row_slot = row_slot.data_ptr<int32_t>();
  args.row_prob = row_prob.data_ptr<float>();
  args.num_experts = static_cast<int>(E);
  args.hidden = static_cast<int>(H);
  args.ffn = static_cast<int>(F);
  args.per_rank = static_cast<int>(max_tokens * topk);
  args.topk = static_cast<int>(topk);
  args.comm_blocks = static_cast<int>(comm_blocks);
  args.world = static_cast<int>(peer_bases.numel());
  args.rows = reinterpret_cast<__nv_bfloat16*>(rows.data_ptr());
  args.act = reinterpret_cast<__nv_bfloat16*>(act.data_ptr());
  args.h_out = h_out ? reinterpret_cast<__nv_bfloat16*>(h_out->data_ptr()) : nullptr;
  args.h_rows = h_out ? static_cast<int>(h_out->size(0)) : 0;
  args.rows_ready = reinterpret_cast<uint32_t*>(counters.data_ptr<int32_t>());
  args.fc1_done = args.rows_ready + max_mblocks;
  args.fc2_done = args.fc1_done + max_mblocks;
  args.tile_counter = args.fc2_done + max_macro;
  args.arrivals = args.tile_counter + 1;
  args.ring_mblocks = static_cast<int>(ring_mblocks);
  args.ring_slots = static_cast<int>(ring_slots);
  args.minibatch_rows = static_cast<int>(minibatch_rows);
  args.timeout_ns = static_cast<uint64_t>(timeout_ns);
  args.report = timeout_report_device(kReportForwardMegakernel, rank, timeout_ns);
  args.skip = static_cast<int>(profile_skip);
  args.trace = trace ? trace->data_ptr<int64_t>() : nullptr;
  if (blockwise) {
    args.rows_fp8 = fp8_rows_of("moe_forward_megakernel", "rows", rows, *rows_scales,
                                buffer_rows, H);
    args.act_fp8 = fp8_rows_of("moe_forward_megakernel", "act", act, *act_scales,
                               rows.size(0), F);
    MOK_HOST_CHECK(act.size(0) == rows.size(0),
                   "moe_forward_megakernel: act must have the rows' rows");
    args.w1_block_scales = w1_scales->data_ptr<uint8_t>();
    args.w2_block_scales = w2_scales->data_ptr<uint8_t>();
    args.w1_row_blocks = static_cast<int>(w1_scales->size(1));
    args.w2_row_blocks = static_cast<int>(w2_scales->size(1));
  }

  ForwardMaps maps{};
  if (blockwise) {
    const int64_t n = rows.size(0);
    maps.rows = fp8_row_tile_map(rows.data_ptr(), n, H, rows.stride(0));
    maps.act = fp8_row_tile_map(act.data_ptr(), n, F, act.stride(0));
    maps.rows_scales = fp8_row_scales_map(rows_scales->data_ptr(), rows_scales->size(0),
                                          rows_scales->size(1), rows_scales->stride(0),
                                          Fp8Ring::kScaleBlocks);
    maps.act_scales = fp8_row_scales_map(act_scales->data_ptr(), act_scales->size(0),
                                         act_scales->size(1), act_scales->stride(0),
                                         Fp8Ring::kScaleBlocks);
    maps.w1 = fp8_expert_weight_map(w1.data_ptr(), E, F1, H, w1.stride(0), w1.stride(1),
                                    gated ? 2 : 1);
    maps.w2 = fp8_expert_weight_map(w2.data_ptr(), E, H, F, w2.stride(0), w2.stride(1), 1);
    maps.act_store = fp8_staged_codes_map(act.data_ptr(), n, F, act.stride(0));
  } else {
    maps.rows = rows_tensor_map(rows);
    maps.act = rows_tensor_map(act);
    maps.w1 = weight_tensor_map(w1, gated ? 2 : 1, w1_scales, maps.w1_scales);
    maps.w2 = weight_tensor_map(w2, 1, w2_scales, maps.w2_scales);
    maps.act_store = staged_rows_map(act.data_ptr(), act.size(0), F, 1, F);
  }
  maps.h_store = h_out ? staged_rows_map(h_out->data_ptr(), h_out->size(0), F, gated ? 2 : 1, F1)
                       : CUtensorMap{};
  const ForwardOperands operands = blockwise ? kFp8Blockwise
                                   : codes   ? kMxfp8Codes
                                   : mxfp8   ? kMxfp8Values
                                             : kBf16Operands;
  const bool diagnostic = profile_skip != 0 || trace.has_value();
  MOK_DISPATCH_ACTIVATION(activation, KACT,
                          if (diagnostic) launch_forward<KACT, true>(operands, maps, args);
                          else launch_forward<KACT, false>(operands, maps, args));
}

}  // namespace mok
