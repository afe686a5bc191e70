// The backward megakernel: pull dY (and, recomputing, x), FC1 again where forward kept
// nothing, FC2-dgrad with the activation backward, dW2, FC1-dgrad with dX rows and dprobs
// pushed to their (token, k) slots, and dW1, in one persistent launch (grid = SM count, one
// block per SM). The mirror of megakernel/moe_forward.cu:
//   tickets [0, comm_blocks)  first pull rows (megakernel/row_pull.cuh) from the source ranks'
//                             published buffers - dY where forward's x was, and x again where
//                             the inputs are recomputed - into the row buffers, macrobatch by
//                             macrobatch, counted per m-block; then they join the tiles.
//   every block               runs tiles of one index space (megakernel/backward_tiles.cuh),
//                             handed out in increasing order (tile_queue.cuh). The producer
//                             thread waits for a tile's inputs (acquire) and streams its
//                             operands by TMA; the consumer warpgroups run its MMAs, each on
//                             its own 64 rows, stage the result as bf16 rows and hand them to
//                             a storer warp (warps 1-2 of the producer warpgroup,
//                             megakernel/backward_storer.cuh), which makes the epilogue's
//                             outputs (FC1's activation, FC2-dgrad's activation backward),
//                             stores and counts them while its consumer runs the next tile's
//                             MMAs; fp32 weight gradients and carries leave the consumers'
//                             registers directly (gemm/sm90/wgrad.cuh).
// Two settings (the recipe's kernel.backward_inputs):
//   saved       forward's x rows, h and act at their schedule positions; one macrobatch.
//   recomputed  a ring of `ring_slots` macrobatch slots (macrobatch_ring.cuh) holds the x and
//               dY rows, h, act, dh and dprob partials of the macrobatches in flight, so nothing
//               the launch holds grows with the routing beyond the ring: the pull of a
//               macrobatch waits until every tile of the one that held its slot is done
//               (macro_done); FC1 tiles recompute h and act per macrobatch; an expert's weight
//               gradient crossing a macrobatch boundary is carried in fp32 from one part to the
//               next (backward_tiles.cuh), through ring_slots + 1 carry slots.
// Both give the same bits: every output element is computed by one chain of operations in a
// fixed order (the FC1 tile is forward's; a carried weight-gradient tile continues the MMA
// accumulation its first part started).
// Operands: dgrad reads the weights as stored (N-major B), wgrad reads rows of dY, act, dh and
// x with K = the part's rows (both operands MN-major); no transposed copies.
// MXFP8 (kMx; recomputed inputs only): every GEMM multiplies MXFP8 values in bf16 with fp32
// accumulation, the separate path's products (mok_megatron/cuda/operands.py): rounding tiles
// (megakernel/mx_round_tile.cuh) round dY and x once pulled, act once FC1 has stored it and
// dh once FC2-dgrad has, along K into rows_k / dout_k / dh_k and along the rows in place; the
// weights come as MXFP8 values quantized once per optimizer step, W1 along H for FC1 as
// forward reads it, and for the dgrads transposed along their K (W2^T [E, F, H], W1^T
// [E, H, F1]: K-major B, as forward's tiles read weights).
// Blockwise FP8 (kFp8; recomputed inputs only): the separate backward's operands
// (docs/fp8_blockwise.md): rounding tiles (megakernel/fp8_round_tile.cuh, blocks of 128 both
// ways) turn dY, x and dh into the FP8 engine's A operand along K (E4M3 codes and transposed
// E8M0 scale codes, buffers of their own) and round them, and act, along the rows in place;
// FC1 again and both dgrads run on the FP8 engine's tiles (gemm/sm90/fp8_mainloop.cuh: 128
// wide, 128 of K per stage, promoted per stage) with the weights' codes quantized once per
// optimizer step (W1 for FC1 as forward reads it, W2^T and W1^T K-major for the dgrads) and
// the same epilogues, the weight gradients on the BF16 engine over the rounded rows. Both
// engines' tiles share one stage ring (Fp8RingOverStages: an FP8 stage inside a BF16 one, the
// same barriers), so a tile of one follows a tile of the other without a drain.
// Deadlock freedom is forward's argument: tiles depend on lower indices or on the pull, and
// the pull on tiles of earlier macrobatches only. A tile's counts (FC1, FC2-dgrad, and the
// ring's macro_done for the tiles handed on) come from its storer, which waits only for its
// consumer's handoffs, its own stores and loads, and an FC1 count its tile's producer already
// saw complete - never for a tile at or above its own; a consumer waits for its storer only
// for free staging slots.
// Memory ordering is forward's too: async-proxy writes complete (bulk_wait), fence.proxy.async,
// release; readers acquire, fence.proxy.async.global, TMA. Plain stores (an expert's partial
// last block of h, act or dh, dprob partials, carries) are fenced by their writers before the
// release. A thread that issues a TMA load of another tile's output itself (the FC2-dgrad
// storer's h loads) acquires the count it depends on itself. Staging slots pass between a
// consumer and its storer by mbarriers, each writer fencing its generic writes for the async
// proxy before it arrives (epilogue_storer.cuh).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <algorithm>

#include "common/error.cuh"
#include "common/ptx.cuh"
#include "gemm/mx_weight_checks.h"
#include "gemm/persistent_launch.cuh"
#include "gemm/sm90/fp8_mainloop.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/sm90/wgrad.cuh"
#include "gemm/timeout_report.h"
#include "megakernel/backward_args.cuh"
#include "megakernel/backward_storer.cuh"
#include "megakernel/backward_tiles.cuh"
#include "megakernel/backward_trace.cuh"
#include "megakernel/epilogue_storer.cuh"
#include "megakernel/fp8_round_tile.cuh"
#include "megakernel/launch_checks.h"
#include "megakernel/row_pull.cuh"
#include "megakernel/tile_queue.cuh"
#include "ops.h"

namespace mok {
namespace {

using namespace sm90;

// The recipes' operands (the file's comment); the kernel's kMx and kFp8. Both FP8 recipes have
// rounding tiles.
enum BackwardOperands : int { kBackwardBf16 = 0, kBackwardMxfp8 = 1, kBackwardFp8Blockwise = 2 };

struct SharedStorage {
  EpilogueBuffers epilogue;  // first: 1024-aligned, as TMA's 128-byte swizzle needs
  StageRing ring;
  int32_t row_begin[kGemmMaxExperts + 1];
  int32_t mblock_begin[kGemmMaxExperts + 1];
  MacroTable macros;
  uint64_t pull_full[kPullMaxSlots];  // row-pulling blocks: their slots live in epilogue
  uint64_t pull_empty[kPullMaxSlots];  // and ring.a/b until their pull is done
  TileQueue<BackwardTile> queue;
  StagingHandoff<BackwardRecord> handoff[kGemmConsumers];  // consumer -> its storer warp
  uint64_t h_full[kGemmConsumers];  // each storer's h loads (FC2-dgrad)
  int consumer_tiles[kGemmConsumers];  // tiles each consumer began (its storer's waits)
  BackwardStorerTargets storer_targets;  // read by the storers in place
  uint32_t ticket;
};
static_assert(offsetof(SharedStorage, ring) == sizeof(EpilogueBuffers),
              "the pull's slots span epilogue, ring.a and ring.b (row_pull.cuh: kPullBytes)");
// 230712 bytes before the storers, 231120 with their handoffs, h barriers and targets (the
// staging buffers' two slots hold every handoff: FC2-dgrad's h comes into slot 1 in parts), of
// 232448; the stage ring keeps its 3 stages.
constexpr size_t kSharedBytes = aligned_smem_bytes<SharedStorage>();
static_assert(kSharedBytes <= kMaxDynamicSmemBytes, "shared memory of one block per SM");

constexpr uint32_t kDgrad2StageBytes = kATileBytes + kDgrad2Cols * kGemmBlockK * 2;

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The timeout report's role of a wait for progress p.
__device__ __forceinline__ int wait_role(int p) {
  return p == kRowsPulled ? kWaitRowsReady
         : p == kFc1Stored ? kWaitFc1Done
         : p == kDhStored  ? kWaitDgradDone
                           : kWaitRounded;
}

// Both consumer warpgroups of a blockwise rounding tile meet at wgrad.cuh's kConsumersBarrier
// (fp8_round_tile.cuh): both reach every use of it in the same order, the weight-gradient
// tiles' included. The unit's column maxima live in the first one's staging buffer, once its
// storer has released every handoff there (StagingWriter::drain).
static_assert(sizeof(WideColumnMaxima) <= kStagedBufBytes, "the maxima fit a staging buffer");

// kDiagnostic: the kernel that records a trace (a.trace); the production kernel has no stamps
// (forward's reason: their code costs registers even where it never runs).
template <int kAct, bool kDiagnostic, int kOperands>
__global__ void __launch_bounds__(kGemmThreads, 1)
    moe_backward_kernel(const __grid_constant__ BackwardMaps m, const BackwardArgs a) {
  constexpr bool kMx = kOperands == kBackwardMxfp8;
  constexpr bool kFp8 = kOperands == kBackwardFp8Blockwise;
  constexpr bool kRounds = kMx || kFp8;
  constexpr bool kGated = gated_epilogue<kAct>();
  // FC1 and the dgrads: the FP8 engine's tiles (128 wide, 128 of K per stage) under kFp8.
  constexpr int kFc1Cols = kFp8 ? tile_cols<kAct, kFp8BlockN>() : tile_cols<kAct>();
  constexpr int kDgrad1Cols = kFp8 ? kFp8BlockN : kGemmBlockN;
  constexpr int kDgradK = kFp8 ? kFp8BlockK : kGemmBlockK;
  static_assert(!kFp8 || kDgrad2Cols == kFp8BlockN, "an FC2-dgrad tile is one FP8 tile");
  extern __shared__ uint8_t smem_raw[];
  SharedStorage& s = aligned_smem<SharedStorage>(smem_raw);
  int64_t* const trace_buffer = kDiagnostic ? a.trace : nullptr;
  const int E = a.num_experts;
  const bool recompute = a.ring_mblocks > 0;
  if (threadIdx.x < 32) build_mblock_table(a.offsets, E, s.row_begin, s.mblock_begin);
  const int slots = pull_slots(2 * a.hidden);
  const PullRing pull_ring{s.epilogue.out[0], s.pull_full, s.pull_empty, slots,
                           min(32, max(1, slots / kPullLanesDivisor))};
  if (threadIdx.x == 32) {
    const BackwardTrace block_trace = BackwardTrace::make(trace_buffer);
    block_trace.header_ns(kTrStartNs);
    block_trace.header_clock(kTrStartClock);
    s.ticket = atomicAdd(a.arrivals, 1u);
    block_trace.header_value(kTrTicket, s.ticket);
    if (s.ticket < a.comm_blocks) init_pull_ring(pull_ring);
    init_tile_queue(s.queue);
    for (int c = 0; c < kGemmConsumers; ++c) {
      init_staging_handoff(s.handoff[c]);
      mbar_init(&s.h_full[c], 1);
      s.consumer_tiles[c] = 0;
    }
    init_ring(s.ring);
  }
  __syncthreads();
  const int ticket = static_cast<int>(s.ticket);
  const MBlockTable table{s.row_begin, s.mblock_begin, E};
  const int mblocks = s.mblock_begin[E];
  const MacrobatchRing ring = MacrobatchRing::make(a.ring_mblocks, a.ring_slots, mblocks);
  const BackwardOrder order =
      BackwardOrder::make(a.hidden, a.ffn, a.f1, recompute ? kFc1Cols : 0, kRounds, kDgrad1Cols);
  if (threadIdx.x < 32) build_macro_table(s.macros, ring, table, order);
  if (threadIdx.x == 32) {
    s.storer_targets = BackwardStorerTargets{
        StorerTargets{a.row_prob, &m.act_store, &m.h_tile, a.act, a.h, 0, a.ffn, a.f1,
                      a.hidden},
        uint32_t(order.nb_fc1) * kGemmConsumers, order.nb_dgrad2, ring.per_macro,
        ring.on ? a.macro_done : nullptr};
  }
  __syncthreads();

  if (ticket < a.comm_blocks) {
    const RowPlacement placement{ring,         table,    a.minibatch_rows, a.macro_done,
                                 kGemmConsumers, s.macros.tile_begin, true, a.timeout_ns,
                                 a.report};
    const RowStreams streams =
        recompute ? RowStreams{{a.tokens_offset, a.inputs_offset}, {a.dout, a.rows}, 2}
                  : RowStreams{{a.tokens_offset, 0}, {a.dout, nullptr}, 1};
    pull_rows_bulk(RowSource{a.peer_bases, a.row_slot, a.per_rank, a.topk, a.world}, streams,
                   a.hidden, ticket, a.comm_blocks, pull_ring, placement,
                   a.per_mblock[kRowsPulled], a.per_macro[kRowsPulled]);
    // Its rows are pulled (every slot's bulk store has completed): the block's shared memory
    // is free, and it joins the tiles below.
    __syncthreads();
    if (threadIdx.x == 0) BackwardTrace::make(trace_buffer).header_clock(kTrPullEndClock);
  }

  const int end_tile = s.macros.tile_begin[ring.n_macro];
  const uint32_t fc1_per_mblock = uint32_t(order.nb_fc1) * kGemmConsumers;
  const uint32_t dgrad2_per_mblock = uint32_t(order.nb_dgrad2) * kGemmConsumers;
  // What progress p counts per m-block once complete: rows_in of its rows pulled, or every
  // tile half of the kind that makes it.
  auto complete_per_mblock = [&](int p, int rows_in) {
    switch (p) {
      case kRowsPulled: return uint32_t(rows_in);
      case kFc1Stored: return fc1_per_mblock;
      case kDhStored: return dgrad2_per_mblock;
      case kInRounded: return uint32_t(order.nb_round_in()) * kGemmConsumers;
      case kActRounded: return uint32_t(order.nb_round_act) * kGemmConsumers;
      default: return uint32_t(order.nb_round_dh) * kGemmConsumers;
    }
  };
  auto k_blocks_of = [&](const BackwardTile& w) {
    if (is_round_tile(w.kind)) return 0;
    if (w.kind == kFc1 || w.kind == kDgrad2) return ceil_div(a.hidden, kDgradK);
    if (w.kind == kDgrad1) return ceil_div(a.f1, kDgradK);
    return ceil_div(w.rows, kGemmBlockK);
  };

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    warpgroup_reg_dealloc<kMegakernelProducerRegs>();
    const int warp = threadIdx.x / 32;
    if (warp >= 1 && warp <= kGemmConsumers) {
      // Warp c + 1 stores what consumer warpgroup c stages (backward_storer.cuh).
      const BackwardTrace storer_trace = warp == 1 && threadIdx.x % 32 == 0
                                             ? BackwardTrace::make(trace_buffer)
                                             : BackwardTrace{nullptr};
      run_backward_storer<kAct, kFc1Cols, kDgrad1Cols>(
          s.handoff[warp - 1], s.epilogue.out[warp - 1], &s.h_full[warp - 1],
          &s.consumer_tiles[warp - 1], a, m, s.storer_targets, storer_trace);
      return;
    }
    if (threadIdx.x != 0) return;
    // A tile's inputs (tile_needs), per m-block of it (a dgrad or FC1 tile's own, a
    // weight-gradient part's every one). Later tiles of a macrobatch usually find a kind of
    // input complete for the whole macrobatch: once this thread has seen that (acquire, then
    // the async-proxy fence that orders it for its later TMA loads) it waits for that kind of
    // that macrobatch no more, and a weight-gradient tile of a few k-blocks does not pay an L2
    // round trip and a fence on the producer's path per tile. Tiles come in macrobatch order,
    // so one macrobatch per kind is remembered.
    int seen[kProgressKinds];  // per kind: the macrobatch seen complete
#pragma unroll
    for (int p = 0; p < kProgressKinds; ++p) seen[p] = -1;
    auto wait_inputs = [&](const BackwardTile& w) {
      const uint32_t needs = tile_needs<kRounds>(w.kind, recompute);
      bool acquired = false;
      const int j = w.macro;
      uint32_t waiting = 0;
#pragma unroll
      for (int p = 0; p < kProgressKinds; ++p) {
        if (!((needs >> p) & 1u) || seen[p] == j) continue;
        const uint32_t target =
            p == kRowsPulled ? uint32_t(s.macros.row_begin[j + 1] - s.macros.row_begin[j])
                             : uint32_t(ring.mblocks_in(j)) * complete_per_mblock(p, 0);
        if (ld_acquire_gpu_u32(&a.per_macro[p][j]) >= target) seen[p] = j;
        else waiting |= 1u << p;
        acquired = true;
      }
      const bool part = w.kind == kWgrad2 || w.kind == kWgrad1;
      if (waiting != 0 && w.rows > 0) {
        const int mb0 = part ? table.mblock_of_row(w.srow0, w.expert) : w.block;
        const int mb1 = part ? table.mblock_of_row(w.srow0 + w.rows - 1, w.expert) + 1 : mb0 + 1;
        for (int mb = mb0; mb < mb1; ++mb) {
          const int rows_in = min(kGemmBlockM, w.rows - (mb - mb0) * kGemmBlockM);
#pragma unroll
          for (int p = 0; p < kProgressKinds; ++p) {
            if ((waiting >> p) & 1u) {
              counter_wait(&a.per_mblock[p][mb], complete_per_mblock(p, rows_in), a.timeout_ns,
                           wait_role(p), w.tile, mb, a.report);
            }
          }
        }
      }
      if (acquired) fence_proxy_async_global();
    };
    int it = 0;
    const BackwardTrace trace = BackwardTrace::make(trace_buffer);
    // One index taken ahead, as in forward: the atomic's round trip overlaps this tile's loads.
    int ahead = take_tile(a.tile_counter, end_tile);
    for (int seq = 0;; ++seq) {
      trace.stamp(seq, kBtProducerStart);
      const int tile = ahead;
      if (tile < 0) {
        push_tile(s.queue, seq, BackwardTile{-1}, a.timeout_ns, a.report);
        break;
      }
      ahead = take_tile(a.tile_counter, end_tile);
      const BackwardTile w = backward_tile_at(order, ring, table, s.macros, tile);
      trace.stamp(seq, kBtTaken);
      push_tile(s.queue, seq, w, a.timeout_ns, a.report);
      trace.stamp(seq, kBtPushed);
      wait_inputs(w);
      trace.stamp(seq, kBtReady);
      if constexpr (kFp8) {
        if (w.kind == kFc1 || w.kind == kDgrad2 || w.kind == kDgrad1) {
          Fp8RingOverStages fp8_ring = Fp8RingOverStages::over(s.ring);
          if (w.kind == kFc1) {
            produce_fp8_tile<kGated>(
                fp8_ring, it, k_blocks_of(w), tile, &m.rows_k, &m.rows_k_scales, &m.w1_k,
                Fp8Weights{a.w1_block_scales, ceil_div(a.f1, kFp8ScaleBlock), a.ffn}, w.row0,
                w.n_block * kFc1Cols, w.expert, a.timeout_ns, a.report);
          } else if (w.kind == kDgrad2) {
            produce_fp8_tile<false>(
                fp8_ring, it, k_blocks_of(w), tile, &m.dout_rows, &m.dout_k_scales, &m.w2_dgrad,
                Fp8Weights{a.w2_t_block_scales, ceil_div(a.ffn, kFp8ScaleBlock), a.ffn}, w.row0,
                w.n_block * kDgrad2Cols, w.expert, a.timeout_ns, a.report);
          } else {
            produce_fp8_tile<false>(
                fp8_ring, it, k_blocks_of(w), tile, &m.dh_rows, &m.dh_k_scales, &m.w1_dgrad,
                Fp8Weights{a.w1_t_block_scales, ceil_div(a.hidden, kFp8ScaleBlock), a.hidden},
                w.row0, w.n_block * kDgrad1Cols, w.expert, a.timeout_ns, a.report);
          }
          trace.stamp(seq, kBtLoadsIssued);
          continue;
        }
      }
      const uint32_t bytes = w.kind == kDgrad2 ? kDgrad2StageBytes : uint32_t(kStageBytes);
      produce_tile(
          s.ring, it, k_blocks_of(w), tile, a.timeout_ns, a.report,
          [&](int stage, int k0) {
            uint64_t* full = &s.ring.full[stage];
            uint8_t* A = s.ring.a[stage];
            uint8_t* B = s.ring.b[stage];
            switch (w.kind) {
              case kFc1:
                tma_load_4d(A, &m.rows_k, full, k0, w.row0, 0, 0);
                load_weight_tile<kGated>(B, &m.w1_k, full, k0, w.n_block * kFc1Cols, w.expert);
                break;
              case kDgrad2:
                tma_load_4d(A, &m.dout_rows, full, k0, w.row0, 0, 0);
                if constexpr (kMx) {
                  tma_load_4d(B, &m.w2_dgrad, full, k0, w.n_block * kDgrad2Cols, 0, w.expert);
                } else {
                  load_mn_boxes(B, &m.w2_dgrad, full, w.n_block * kDgrad2Cols, k0, w.expert,
                                kDgrad2Cols / 64);
                }
                break;
              case kDgrad1:
                tma_load_4d(A, &m.dh_rows, full, k0, w.row0, 0, 0);
                if constexpr (kMx) {
                  load_weight_tile<false>(B, &m.w1_dgrad, full, k0, w.n_block * kGemmBlockN,
                                          w.expert);
                } else {
                  load_mn_boxes(B, &m.w1_dgrad, full, w.n_block * kGemmBlockN, k0, w.expert,
                                kGemmBlockN / 64);
                }
                break;
              case kWgrad2:
                load_mn_boxes(A, &m.dout_mn, full, w.block * kGemmBlockM, w.row0 + k0, 0,
                              kGemmBlockM / 64);
                load_mn_boxes(B, &m.act_mn, full, w.n_block * kGemmBlockN, w.row0 + k0, 0,
                              kGemmBlockN / 64);
                break;
              default:
                load_mn_boxes(A, &m.dh_mn, full, w.block * kGemmBlockM, w.row0 + k0, 0,
                              kGemmBlockM / 64);
                load_mn_boxes(B, &m.rows_mn, full, w.n_block * kGemmBlockN, w.row0 + k0, 0,
                              kGemmBlockN / 64);
            }
          },
          bytes);
      trace.stamp(seq, kBtLoadsIssued);
    }
    return;
  }

  warpgroup_reg_alloc<kMegakernelConsumerRegs>();
  const int consumer = warpgroup - 1;
  const int t = threadIdx.x % 128;
  const bool leader = t == 0;
  const int wg_barrier = kStagingBarrier + consumer;  // this warpgroup's named barrier
  StagingWriter<BackwardRecord> staging{&s.handoff[consumer], s.epilogue.out[consumer], 0,
                                        leader};
  const BackwardTrace trace =
      leader && consumer == 0 ? BackwardTrace::make(trace_buffer) : BackwardTrace{nullptr};
  float acc[kAccRegs];  // BF16 FC2-dgrad tiles use the first kDgrad2Cols / 2 (m64n128)
  // The FP8 engine's tiles (kFp8) take their MMAs' partial sums in the first kFp8AccRegs
  // (m64n128) and accumulate into the rest: the BF16 tiles' wgmmas keep all of acc live, and
  // a partial-sum array of its own did not fit beside it (ptxas serialized every wgmma:
  // C7512); with the halves the other way round ptxas serialized them too (C7511).
  float(&partial8)[kFp8AccRegs] = *reinterpret_cast<float(*)[kFp8AccRegs]>(&acc[0]);
  float(&acc8)[kFp8AccRegs] = *reinterpret_cast<float(*)[kFp8AccRegs]>(&acc[kFp8AccRegs]);
  static_assert(2 * kFp8AccRegs <= kAccRegs, "an FP8 tile's sums and partial sums fit acc");
  Fp8RingOverStages fp8_ring = Fp8RingOverStages::over(s.ring);
  int it = 0;
  // The ring's slot reuse: this warpgroup's finished tiles of one macrobatch that its storer
  // does not count (backward_storer.cuh: those it takes a handoff of), released into
  // macro_done together when its next tile belongs to another macrobatch (the entry arrives
  // before the producer waits for that tile's inputs, so a count the pull waits for is never
  // held back behind a wait that needs the pull) and at the end - one release per macrobatch
  // switch rather than one per tile on the consumers' path.
  int done_macro = -1;
  uint32_t done_tiles = 0;
  auto release_done = [&] {
    if (done_tiles == 0) return;
    // Every thread's reads of the slot (plain loads; TMA loads have landed) come first.
    named_barrier_sync(wg_barrier, 128);
    if (leader) red_release_gpu_add_u32(&a.macro_done[done_macro], done_tiles);
    done_tiles = 0;
  };
  // Where a weight-gradient tile's carry lives: its data (slot by macrobatch) and its flag.
  auto carry_data = [&](const BackwardTile& w, int macro) {
    const int64_t tile = int64_t(macro % (a.ring_slots + 1)) * order.wgrad_tiles() +
                         order.wgrad_index(w);
    return a.carry + (tile * kGemmConsumers + consumer) * kCarryFloats;
  };
  auto carry_flag = [&](const BackwardTile& w, int macro) {
    const int64_t tile = int64_t(macro) * order.wgrad_tiles() + order.wgrad_index(w);
    return &a.carry_ready[tile * kGemmConsumers + consumer];
  };
  // A rounding tile: its m-block's input complete (this thread's loads follow its own
  // acquire), its rows rounded, plain stores fenced before the count (their readers' TMA
  // loads acquire it); counted once per warpgroup. kMx: each warpgroup rounds its own 64 rows
  // (whole 32-row blocks). kFp8: the two round the whole m-block together (its 128-row blocks
  // along the rows span them), once the first one's storer has released its staging slots
  // (the units' scratch is there).
  auto round_tile = [&](const BackwardTile& w, int seq) {
    const int input = round_tile_input(w.kind);
    const uint32_t* ready = &a.per_mblock[input][w.block];
    if (leader) {
      counter_wait(ready, complete_per_mblock(input, min(kGemmBlockM, w.rows)), a.timeout_ns,
                   wait_role(input), w.tile, w.block, a.report);
    }
    if constexpr (kFp8) {
      if (consumer == 0) staging.drain(w.tile, a.timeout_ns, a.report);
      named_barrier_sync(kConsumersBarrier, kWideThreads);
    } else {
      named_barrier_sync(wg_barrier, 128);
    }
    ld_acquire_gpu_u32(ready);
    trace.stamp(seq, kBtInputsReady);
    // The operand and its columns: dY then x (round in), act, dh.
    const bool dout = w.kind == kRoundIn && w.n_block < order.nb_round_h;
    const int col0 = (w.kind == kRoundIn && !dout ? w.n_block - order.nb_round_h : w.n_block) *
                     kRoundCols;
    if constexpr (kFp8) {
      WideColumnMaxima& scratch = *reinterpret_cast<WideColumnMaxima*>(s.epilogue.out[0]);
      const int t2 = threadIdx.x - 128;  // over both warpgroups
      const int rows_valid = min(kGemmBlockM, w.rows);
      if (w.kind == kRoundIn) {
        fp8_round_tile_rows<true>(dout ? a.dout : a.rows, dout ? a.dout_fp8 : a.rows_fp8,
                                  a.hidden, w.row0, rows_valid, col0, scratch, t2,
                                  kConsumersBarrier);
      } else if (w.kind == kRoundAct) {
        fp8_round_tile_rows<false>(a.act, Fp8Rows{}, a.ffn, w.row0, rows_valid, col0, scratch,
                                   t2, kConsumersBarrier);
      } else {
        fp8_round_tile_rows<true>(a.dh, a.dh_fp8, a.f1, w.row0, rows_valid, col0, scratch, t2,
                                  kConsumersBarrier);
      }
      // The scratch's plain writes come before any later TMA of the staging buffer (its
      // storer's h loads write it; its stores read it).
      fence_proxy_async_shared();
    } else {
      const int64_t row0 = w.row0 + kStagedRows * consumer;
      const int rows_valid = max(0, min(kStagedRows, w.rows - kStagedRows * consumer));
      if (w.kind == kRoundIn) {
        __nv_bfloat16* src = dout ? a.dout : a.rows;
        round_tile_rows<true, true>(src, dout ? a.dout_k : a.rows_k, src, a.hidden, row0,
                                    rows_valid, col0, t);
      } else if (w.kind == kRoundAct) {
        round_tile_rows<false, true>(a.act, nullptr, a.act, a.ffn, row0, rows_valid, col0, t);
      } else {
        round_tile_rows<true, true>(a.dh, a.dh_k, a.dh, a.f1, row0, rows_valid, col0, t);
      }
    }
    trace.stamp(seq, kBtMainloopEnd);
    __threadfence();
    named_barrier_sync(wg_barrier, 128);
    if (leader) {
      fence_proxy_async_global();
      const int p = round_tile_output(w.kind);
      red_release_gpu_add_u32(&a.per_mblock[p][w.block], 1);
      red_release_gpu_add_u32(&a.per_macro[p][w.macro], 1);
    }
  };
  for (int seq = 0;; ++seq) {
    trace.stamp(seq, kBtTileStart);
    const BackwardTile w = wait_tile(s.queue, seq, a.timeout_ns, a.report);
    trace.stamp(seq, kBtTileQueued);
    release_tile(s.queue, seq);
    if (ring.on && (w.tile < 0 || w.macro != done_macro)) {
      release_done();
      done_macro = w.macro;
    }
    if (w.tile < 0) break;
    if (leader) *reinterpret_cast<volatile int*>(&s.consumer_tiles[consumer]) = seq + 1;
    trace.tile_value(seq, kBtTileId, int64_t(w.tile) * 8 + w.kind);
    trace.tile_value(seq, kBtMacro, w.macro);
    trace.tile_value(seq, kBtRows, w.rows);
    trace.tile_value(seq, kBtPart, w.part);
    const int k_blocks = k_blocks_of(w);
    // Whether the storer counts this tile in macro_done (it takes a handoff that reads or
    // writes the tile's ring slot); else this warpgroup does.
    bool storer_counts = false;

    if (is_round_tile(w.kind)) {
      // Its work holds no accumulators, but the compiler keeps the last tile's live through
      // it (an instruction that ended their life would serialize every wgmma of the kernel:
      // ptxas C7515), so it runs in what registers remain and spills some.
      if constexpr (kRounds) round_tile(w, seq);
    } else if (w.kind == kFc1 || w.kind == kDgrad2 || w.kind == kDgrad1) {
      const int row0 = w.row0 + kStagedRows * consumer;    // in the row buffers
      const int srow0 = w.srow0 + kStagedRows * consumer;  // in the schedule
      const int rows_valid = max(0, min(kStagedRows, w.rows - kStagedRows * consumer));
      const bool full = w.rows >= kStagedRows * (consumer + 1);
      if (rows_valid == 0) {
        // An m-block of at most 64 rows is the first warpgroup's alone (tile_engine.cuh): no
        // rows, nothing stored, counted here.
        if constexpr (kFp8) {
          pass_fp8_tile(fp8_ring, it, k_blocks, w.tile, leader, wg_barrier, a.timeout_ns,
                        a.report);
        } else {
          pass_tile(s.ring, it, k_blocks, w.tile, leader, wg_barrier, a.timeout_ns, a.report);
        }
        if (w.kind != kDgrad1 && leader) {
          const int p = w.kind == kFc1 ? kFc1Stored : kDhStored;
          red_release_gpu_add_u32(&a.per_mblock[p][w.block], 1);
          red_release_gpu_add_u32(&a.per_macro[p][w.macro], 1);
        }
      } else {
        // The tile's rows as bf16 into the staging slots, for the storer to store and count
        // (backward_storer.cuh).
        trace.stamp(seq, kBtInputsReady);
        auto acquire = [&] {
          uint8_t* slots = staging.acquire(2, w.tile, a.timeout_ns, a.report);
          trace.stamp(seq, kBtEpilogue1);
          return slots;
        };
        auto hand_off = [&](int kind, int col0) {
          staging.hand_off(BackwardRecord{kind, 2, 1, row0, srow0, rows_valid, full, col0,
                                          w.block, seq});
        };
        if (w.kind == kFc1) {
          // Forward's FC1 tile: h (gate | up) as bf16, the rounding the activation starts from
          // (kFp8: the FP8 engine's tile of the separate path's FC1, act kept bf16 here for
          // dW2's rounding tile).
          if constexpr (kFp8) {
            consume_fp8_tile(fp8_ring, it, k_blocks, w.tile, consumer, leader, w.row0, acc8,
                             partial8, a.timeout_ns, a.report);
            trace.stamp(seq, kBtMainloopEnd);
            uint8_t* slots = acquire();
            // Gated: the 64 gate columns in slot 0, the up columns at the same place in
            // slot 1 (store_fc1_staged's layout).
            write_staged_rounded<kFc1Cols>(slots, t, acc8);
            if constexpr (kGated) {
              write_staged_rounded<kFc1Cols>(slots + kStagedSlotBytes, t, acc8,
                                             4 * (kFc1Cols / 8));
            }
          } else {
            consume_tile(s.ring, it, k_blocks, w.tile, consumer, leader, acc, a.timeout_ns,
                         a.report);
            trace.stamp(seq, kBtMainloopEnd);
            write_staged_rounded<kGemmBlockN>(acquire(), t, acc);
          }
          hand_off(kStagedFc1, w.n_block * kFc1Cols);
        } else if (w.kind == kDgrad2) {
          // dA as bf16 (dgrad_epilogue.cuh: the activation backward's rounding point) in slot
          // 0; the storer brings the tile's h into slot 1 (its m-block's FC1 count, when
          // recomputing, was complete before the producer loaded this tile's first stage).
          if constexpr (kFp8) {
            consume_fp8_tile(fp8_ring, it, k_blocks, w.tile, consumer, leader, w.row0, acc8,
                             partial8, a.timeout_ns, a.report);
            trace.stamp(seq, kBtMainloopEnd);
            write_staged_rounded<kDgrad2Cols>(acquire(), t, acc8);
          } else {
            consume_tile<kDgrad2Cols, false, !kMx>(s.ring, it, k_blocks, w.tile, consumer,
                                                   leader, acc, a.timeout_ns, a.report);
            trace.stamp(seq, kBtMainloopEnd);
            write_staged_rounded<kDgrad2Cols>(acquire(), t, acc);
          }
          hand_off(kStagedDgrad2, w.n_block * kDgrad2Cols);
        } else {
          // dX rows, unswizzled: each leaves as one bulk store to its (token, k) slot.
          if constexpr (kFp8) {
            consume_fp8_tile(fp8_ring, it, k_blocks, w.tile, consumer, leader, w.row0, acc8,
                             partial8, a.timeout_ns, a.report);
            trace.stamp(seq, kBtMainloopEnd);
            write_scatter_staged<kDgrad1Cols>(acc8, acquire(), t);
          } else {
            consume_tile<kGemmBlockN, false, !kMx>(s.ring, it, k_blocks, w.tile, consumer,
                                                   leader, acc, a.timeout_ns, a.report);
            trace.stamp(seq, kBtMainloopEnd);
            write_scatter_staged<kDgrad1Cols>(acc, acquire(), t);
          }
          hand_off(kStagedDgrad1, w.n_block * kDgrad1Cols);
        }
        trace.stamp(seq, kBtEpilogue2);
        storer_counts = true;
      }
    } else {
      // Weight-gradient tile: both warpgroups take every one (KTailZero meets across them).
      const bool wgrad2 = w.kind == kWgrad2;
      const bool carry_in = (w.part & kPartCarryIn) != 0;
      if (k_blocks > 0) {
        if (carry_in) {
          // The part before (an earlier macrobatch's tile) left its sums; every thread
          // acquires the flag its own loads of them follow. (A carried part has rows: loaded
          // here, next to the MMAs, because accumulators written by plain loads on a path that
          // skips the MMAs make ptxas serialize every wgmma of the kernel.)
          counter_wait(carry_flag(w, w.macro - 1), 1, a.timeout_ns, kWaitCarry, w.tile,
                       w.macro, a.report);
          load_carry(acc, carry_data(w, w.macro - 1));
        }
        trace.stamp(seq, kBtInputsReady);
        consume_tile<kGemmBlockN, true, true>(
            s.ring, it, k_blocks, w.tile, consumer, leader, acc, a.timeout_ns, a.report,
            KTailZero<kGemmBlockN / 64>{&s.ring, k_blocks,
                                        w.rows - (k_blocks - 1) * kGemmBlockK, consumer},
            carry_in);
      }
      trace.stamp(seq, kBtMainloopEnd);
      const int M = wgrad2 ? a.hidden : a.f1, N = wgrad2 ? a.ffn : a.hidden;
      const int m0 = w.block * kGemmBlockM + kStagedRows * consumer;
      const int rows_valid = max(0, min(kStagedRows, M - m0));
      const int n0 = w.n_block * kGemmBlockN;
      const int64_t* fp32 = wgrad2 ? a.dw2_fp32 : a.dw1_fp32;
      // fp32 sums (a carry, main_grad's adds) leave the registers as fire-and-forget stores
      // here; bf16 rows go to the storer.
      if (w.part & kPartCarryOut) {
        trace.stamp(seq, kBtEpilogue1);
        store_carry(acc, carry_data(w, w.macro));
        trace.stamp(seq, kBtEpilogue2);
        __threadfence();
        named_barrier_sync(wg_barrier, 128);
        if (leader) red_release_gpu_add_u32(carry_flag(w, w.macro), 1);
      } else if (fp32 != nullptr) {
        trace.stamp(seq, kBtEpilogue1);
        if (k_blocks > 0) {
          accumulate_fp32(acc, reinterpret_cast<float*>(fp32[w.expert]), m0, n0, rows_valid, N);
        }
        trace.stamp(seq, kBtEpilogue2);
      } else if (rows_valid > 0) {
        uint8_t* slots = staging.acquire(2, w.tile, a.timeout_ns, a.report);
        trace.stamp(seq, kBtEpilogue1);
        // An expert without rows has dW = 0, written without touching the accumulators (a
        // non-wgmma write to them makes ptxas serialize every wgmma of the kernel).
        write_staged<kGemmBlockN>(slots, t, [&](int j, int i) {
          return k_blocks > 0 ? __floats2bfloat162_rn(acc[4 * j + 2 * i], acc[4 * j + 2 * i + 1])
                              : __floats2bfloat162_rn(0.f, 0.f);
        });
        staging.hand_off(BackwardRecord{wgrad2 ? kStagedWgrad2 : kStagedWgrad1, 2, 1,
                                        w.expert * M + m0, 0, rows_valid,
                                        m0 + kStagedRows <= M, n0, 0, seq});
        trace.stamp(seq, kBtEpilogue2);
      }
    }
    // The tile has read what it needs of its macrobatch's ring slot (its TMA loads have
    // landed, its plain loads returned): counted once per warpgroup for the pull's reuse.
    if (!storer_counts) ++done_tiles;
    trace.stamp(seq, kBtTileEnd);
  }
  staging.hand_off_record(BackwardRecord{kStagedEnd, 1}, -1, a.timeout_ns, a.report);
  trace.header_ns(kTrEndNs);
  trace.header_clock(kTrEndClock);
}

template <int kAct, bool kDiagnostic, int kOperands>
void launch_kernel(const BackwardMaps& maps, const BackwardArgs& args) {
  launch_persistent(moe_backward_kernel<kAct, kDiagnostic, kOperands>, kSharedBytes, maps, args);
}

template <int kAct, int kOperands>
void launch_backward(bool diagnostic, const BackwardMaps& maps, const BackwardArgs& args) {
  if (diagnostic) launch_kernel<kAct, true, kOperands>(maps, args);
  else launch_kernel<kAct, false, kOperands>(maps, args);
}

// A blockwise weight's codes as read (check_fp8_block_weight) with N x K = n x k.
void check_fp8_weight(const at::Tensor& w, const at::Tensor& scales, int64_t E, int64_t n,
                      int64_t k, const at::Tensor& rows, const char* name) {
  check_fp8_block_weight("moe_backward_megakernel", w, scales);
  MOK_HOST_CHECK(w.size(0) == E && w.size(1) == n && w.size(2) == k && w.device() == rows.device(),
                 "moe_backward_megakernel: ", name, " must be [", E, ", ", n, ", ", k,
                 "] codes on the rows' GPU, got ", w.sizes());
}

const int64_t* fp32_grads(const c10::optional<at::Tensor>& ptrs, int64_t E, const char* name) {
  if (!ptrs) return nullptr;
  MOK_HOST_CHECK(ptrs->is_cuda() && ptrs->scalar_type() == at::kLong && ptrs->numel() == E &&
                     ptrs->is_contiguous(),
                 "moe_backward_megakernel: ", name, " must be int64 [E] GPU addresses");
  return ptrs->data_ptr<int64_t>();
}

}  // namespace

void moe_backward_megakernel(const at::Tensor& peer_bases, int64_t tokens_offset,
                             int64_t inputs_offset, int64_t slots_offset, int64_t values_offset,
                             const at::Tensor& offsets, const at::Tensor& row_slot,
                             const at::Tensor& row_prob, int64_t max_tokens, int64_t topk,
                             const at::Tensor& w1, const at::Tensor& w2, int64_t activation,
                             at::Tensor& rows, at::Tensor& h, at::Tensor& act, at::Tensor& dout,
                             at::Tensor& dh, at::Tensor& dprob_part,
                             const c10::optional<at::Tensor>& dw1,
                             const c10::optional<at::Tensor>& dw2,
                             const c10::optional<at::Tensor>& dw1_fp32,
                             const c10::optional<at::Tensor>& dw2_fp32,
                             const c10::optional<at::Tensor>& carry,
                             const c10::optional<at::Tensor>& w1_t,
                             const c10::optional<at::Tensor>& w2_t,
                             const c10::optional<at::Tensor>& rows_k,
                             const c10::optional<at::Tensor>& dout_k,
                             const c10::optional<at::Tensor>& dh_k,
                             const std::vector<at::Tensor>& fp8_scales, at::Tensor& counters,
                             int64_t comm_blocks, int64_t minibatch_rows, int64_t ring_mblocks,
                             int64_t ring_slots, int64_t timeout_ns, int64_t rank,
                             const c10::optional<at::Tensor>& trace) {
  const int64_t E = w1.size(0), H = rows.size(1), F = w2.size(2);
  const bool gated = is_gated(static_cast<int>(activation));
  const int64_t F1 = gated ? 2 * F : F;
  const int64_t cap = row_slot.numel();
  const int64_t max_mblocks = max_schedule_mblocks(cap, E);
  const bool ring_on = ring_mblocks > 0;
  const RingSize ring = RingSize::of(cap, max_mblocks, ring_mblocks, ring_slots);
  const int64_t max_macro = ring.macrobatches, buffer_rows = ring.buffer_rows;
  // An FP8 recipe's launch has rounding tiles and the dgrads' transposed weights; blockwise
  // also the scale codes of its operands along K and of the weights' blocks.
  const bool rounds = w1_t.has_value();
  const bool blockwise = !fp8_scales.empty();
  const bool mx = rounds && !blockwise;
  const BackwardOrder order = BackwardOrder::make(
      static_cast<int>(H), static_cast<int>(F), static_cast<int>(F1), 0, rounds,
      blockwise ? kFp8BlockN : kGemmBlockN);
  const int64_t wgrad_tiles = order.wgrad_tiles();
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  check_megakernel_call("moe_backward_megakernel", w1, w2, offsets, peer_bases, H, F1,
                        minibatch_rows);
  MOK_HOST_CHECK(!ring_on || (ring_slots >= 2 && max_macro <= kMaxMacrobatches),
                 "moe_backward_megakernel: the macrobatch ring needs >= 2 slots and at most ",
                 kMaxMacrobatches, " macrobatches of ", ring_mblocks, " m-blocks over ",
                 max_mblocks, " m-blocks (raise macrobatch_tokens), got ", ring_slots, " slots");
  auto rows_of = [&](const at::Tensor& t, int64_t width) {
    return t.is_cuda() && t.scalar_type() == at::kBFloat16 && t.is_contiguous() &&
           t.dim() == 2 && t.size(0) == buffer_rows && t.size(1) == width;
  };
  MOK_HOST_CHECK(rows_of(rows, H) && rows_of(h, F1) && rows_of(act, F) && rows_of(dout, H) &&
                     rows_of(dh, F1),
                 "moe_backward_megakernel: rows and dout [", buffer_rows, ", H], h and dh [",
                 buffer_rows, ", F1], act [", buffer_rows, ", F]: contiguous bf16 GPU tensors");
  // The FP8 recipes: the dgrads' transposed weights and the buffers of the forms along K.
  MOK_HOST_CHECK(w2_t.has_value() == rounds && rows_k.has_value() == rounds &&
                     dout_k.has_value() == rounds && dh_k.has_value() == rounds,
                 "moe_backward_megakernel: the FP8 recipes take w1_t, w2_t, rows_k, dout_k and "
                 "dh_k together");
  MOK_HOST_CHECK(!blockwise || (rounds && fp8_scales.size() == 6),
                 "moe_backward_megakernel: fp8_blockwise takes six fp8_scales (rows_k, dout_k, "
                 "dh_k, W1, W1^T, W2^T) with w1_t, w2_t, rows_k, dout_k and dh_k, got ",
                 fp8_scales.size());
  MOK_HOST_CHECK(!rounds || ring_on,
                 "moe_backward_megakernel: the FP8 recipes run with recomputed inputs (the "
                 "ring) only: their rounding tiles overwrite the rows they round");
  if (blockwise) {
    check_fp8_weight(w1, fp8_scales[3], E, F1, H, rows, "w1");
    check_fp8_weight(*w1_t, fp8_scales[4], E, H, F1, rows, "w1_t");
    check_fp8_weight(*w2_t, fp8_scales[5], E, F, H, rows, "w2_t");
    MOK_HOST_CHECK(w2.scalar_type() == at::kBFloat16,
                   "moe_backward_megakernel: w2 gives F here (bf16 [E, H, F])");
    MOK_HOST_CHECK(!gated || F % (kFp8BlockN / 2) == 0,
                   "moe_backward_megakernel: fp8_blockwise with a gated activation needs F a "
                   "multiple of ", kFp8BlockN / 2, " (each 64-row half of W1 inside one 128-row "
                   "scale block), got F = ", F);
  } else {
    MOK_HOST_CHECK(w1.scalar_type() == at::kBFloat16 && w2.scalar_type() == at::kBFloat16,
                   "moe_backward_megakernel: W1 and W2 must be bf16 (fp8_blockwise: W1's "
                   "codes)");
  }
  if (mx) {
    auto weight_t = [&](const at::Tensor& w, int64_t n, int64_t k) {
      return w.is_cuda() && w.scalar_type() == at::kBFloat16 && w.is_contiguous() &&
             w.dim() == 3 && w.size(0) == E && w.size(1) == n && w.size(2) == k &&
             w.device() == rows.device();
    };
    MOK_HOST_CHECK(weight_t(*w1_t, H, F1) && weight_t(*w2_t, F, H),
                   "moe_backward_megakernel: w1_t [E, H, F1] and w2_t [E, F, H] must be "
                   "contiguous bf16 (MXFP8 values) on the rows' GPU");
    MOK_HOST_CHECK(rows_of(*rows_k, H) && rows_of(*dout_k, H) && rows_of(*dh_k, F1),
                   "moe_backward_megakernel: rows_k and dout_k [", buffer_rows, ", H], dh_k [",
                   buffer_rows, ", F1]: contiguous bf16 GPU tensors");
  }
  const int64_t nb_dgrad2 = (F + kDgrad2Cols - 1) / kDgrad2Cols;
  MOK_HOST_CHECK(dprob_part.is_cuda() && dprob_part.scalar_type() == at::kFloat &&
                     dprob_part.is_contiguous() && dprob_part.numel() >= buffer_rows * nb_dgrad2,
                 "moe_backward_megakernel: dprob_part must be fp32 with >= ",
                 buffer_rows * nb_dgrad2, " values");
  MOK_HOST_CHECK(dw1.has_value() != dw1_fp32.has_value() &&
                     dw2.has_value() != dw2_fp32.has_value(),
                 "moe_backward_megakernel: each weight gradient is either bf16 (dw) or fp32 "
                 "accumulated (dw_fp32), not both");
  auto stacked = [&](const c10::optional<at::Tensor>& g, int64_t r, int64_t c) {
    return !g || (g->is_cuda() && g->scalar_type() == at::kBFloat16 && g->is_contiguous() &&
                  g->dim() == 3 && g->size(0) == E && g->size(1) == r && g->size(2) == c);
  };
  MOK_HOST_CHECK(stacked(dw1, F1, H) && stacked(dw2, H, F),
                 "moe_backward_megakernel: bf16 gradients must be contiguous [E, F1, H] and "
                 "[E, H, F]");
  // Carries exist only where an expert can cross a macrobatch boundary.
  const int64_t carry_floats =
      max_macro > 1 ? (ring_slots + 1) * wgrad_tiles * kGemmConsumers * kCarryFloats : 0;
  MOK_HOST_CHECK(carry_floats == 0 || (carry && carry->is_cuda() &&
                                       carry->scalar_type() == at::kFloat &&
                                       carry->is_contiguous() && carry->numel() >= carry_floats),
                 "moe_backward_megakernel: carry must be fp32 with >= ", carry_floats,
                 " values");
  const int64_t carry_flags = ring_on ? max_macro * wgrad_tiles * kGemmConsumers : 0;
  const int64_t round_counters = rounds ? 3 * max_mblocks + 3 * max_macro : 0;
  const int64_t num_counters =
      3 * max_mblocks + 4 * max_macro + carry_flags + 2 + round_counters;
  MOK_HOST_CHECK(counters.scalar_type() == at::kInt && counters.is_contiguous() &&
                     counters.numel() >= num_counters,
                 "moe_backward_megakernel: counters must be int32 with >= ", num_counters,
                 " zeros");
  MOK_HOST_CHECK(comm_blocks >= 1 && comm_blocks < sms, "moe_backward_megakernel: comm_blocks ",
                 comm_blocks, " must be in [1, ", sms - 1, "]");
  MOK_HOST_CHECK(!trace || (trace->is_cuda() && trace->scalar_type() == at::kLong &&
                              trace->is_contiguous() &&
                              trace->numel() >= int64_t(sms) * BackwardTrace::kBlockValues),
                 "moe_backward_megakernel: trace must be a contiguous int64 GPU tensor of >= ",
                 int64_t(sms) * BackwardTrace::kBlockValues, " values");
  c10::cuda::CUDAGuard guard(rows.device());

  BackwardArgs args{};
  args.peer_bases = peer_bases.data_ptr<int64_t>();
  args.tokens_offset = tokens_offset;
  args.inputs_offset = inputs_offset;
  args.slots_offset = slots_offset;
  args.values_offset = values_offset;
  args.offsets = offsets.data_ptr<int32_t>();
  args.row_slot = row_slot.data_ptr<int32_t>();
  args.row_prob = row_prob.data_ptr<float>();
  args.num_experts = static_cast<int>(E);
  args.hidden = static_cast<int>(H);
  args.ffn = static_cast<int>(F);
  args.f1 = static_cast<int>(F1);
  args.per_rank = static_cast<int>(max_tokens * topk);
  args.topk = static_cast<int>(topk);
  args.comm_blocks = static_cast<int>(comm_blocks);
  args.world = static_cast<int>(peer_bases.numel());
  args.ring_mblocks = static_cast<int>(ring_mblocks);
  args.ring_slots = static_cast<int>(ring_slots);
  auto bf16 = [](at::Tensor& t) { return reinterpret_cast<__nv_bfloat16*>(t.data_ptr()); };
  args.rows = bf16(rows);
  args.h = bf16(h);
  args.act = bf16(act);
  args.dout = bf16(dout);
  args.dh = bf16(dh);
  if (mx) {
    args.rows_k = bf16(const_cast<at::Tensor&>(*rows_k));
    args.dout_k = bf16(const_cast<at::Tensor&>(*dout_k));
    args.dh_k = bf16(const_cast<at::Tensor&>(*dh_k));
  }
  if (blockwise) {
    const char* who = "moe_backward_megakernel";
    args.rows_fp8 = fp8_rows_of(who, "rows_k", *rows_k, fp8_scales[0], buffer_rows, H);
    args.dout_fp8 = fp8_rows_of(who, "dout_k", *dout_k, fp8_scales[1], buffer_rows, H);
    args.dh_fp8 = fp8_rows_of(who, "dh_k", *dh_k, fp8_scales[2], buffer_rows, F1);
    args.w1_block_scales = fp8_scales[3].data_ptr<uint8_t>();
    args.w1_t_block_scales = fp8_scales[4].data_ptr<uint8_t>();
    args.w2_t_block_scales = fp8_scales[5].data_ptr<uint8_t>();
  }
  args.dprob_part = dprob_part.data_ptr<float>();
  args.dw1 = dw1 ? reinterpret_cast<__nv_bfloat16*>(dw1->data_ptr()) : nullptr;
  args.dw2 = dw2 ? reinterpret_cast<__nv_bfloat16*>(dw2->data_ptr()) : nullptr;
  args.dw1_fp32 = fp32_grads(dw1_fp32, E, "dw1_fp32");
  args.dw2_fp32 = fp32_grads(dw2_fp32, E, "dw2_fp32");
  args.carry = carry_floats > 0 ? carry->data_ptr<float>() : nullptr;
  // Counters (ops.backward_megakernel_counters): per m-block rows pulled, FC1 and FC2-dgrad
  // halves; per macrobatch tile halves done; carry flags; per macrobatch the three totals; the
  // tile and arrival counters; under an FP8 recipe per m-block then per macrobatch the three
  // rounded.
  uint32_t* c = reinterpret_cast<uint32_t*>(counters.data_ptr<int32_t>());
  args.per_mblock[kRowsPulled] = c;
  args.per_mblock[kFc1Stored] = c + max_mblocks;
  args.per_mblock[kDhStored] = c + 2 * max_mblocks;
  args.macro_done = c + 3 * max_mblocks;
  args.carry_ready = args.macro_done + max_macro;
  args.per_macro[kRowsPulled] = args.carry_ready + carry_flags;
  args.per_macro[kFc1Stored] = args.per_macro[kRowsPulled] + max_macro;
  args.per_macro[kDhStored] = args.per_macro[kFc1Stored] + max_macro;
  args.tile_counter = args.per_macro[kDhStored] + max_macro;
  args.arrivals = args.tile_counter + 1;
  if (rounds) {
    uint32_t* r = args.arrivals + 1;
    for (int p = kInRounded; p < kProgressKinds; ++p) {
      args.per_mblock[p] = r + (p - kInRounded) * max_mblocks;
      args.per_macro[p] = r + 3 * max_mblocks + (p - kInRounded) * max_macro;
    }
  }
  args.minibatch_rows = static_cast<int>(minibatch_rows);
  args.timeout_ns = static_cast<uint64_t>(timeout_ns);
  args.report = timeout_report_device(kReportBackwardMegakernel, rank, timeout_ns);
  args.trace = trace ? trace->data_ptr<int64_t>() : nullptr;

  BackwardMaps maps{};
  const int halves = gated ? 2 : 1;
  if (blockwise) {
    // The FP8 engine's operands: codes along K and their scale codes (one block per stage).
    auto codes_map = [&](const at::Tensor& c, int64_t k) {
      return fp8_row_tile_map(c.data_ptr(), c.size(0), k, c.stride(0));
    };
    auto scales_map = [&](const at::Tensor& sc) {
      return fp8_row_scales_map(sc.data_ptr(), sc.size(0), sc.size(1), sc.stride(0),
                                Fp8RingOverStages::kScaleBlocks);
    };
    auto weight_map = [&](const at::Tensor& w, int weight_halves) {
      return fp8_expert_weight_map(w.data_ptr(), w.size(0), w.size(1), w.size(2), w.stride(0),
                                   w.stride(1), weight_halves);
    };
    maps.rows_k = codes_map(*rows_k, H);
    maps.dout_rows = codes_map(*dout_k, H);
    maps.dh_rows = codes_map(*dh_k, F1);
    maps.rows_k_scales = scales_map(fp8_scales[0]);
    maps.dout_k_scales = scales_map(fp8_scales[1]);
    maps.dh_k_scales = scales_map(fp8_scales[2]);
    maps.w1_k = weight_map(w1, halves);
    maps.w1_dgrad = weight_map(*w1_t, 1);
    maps.w2_dgrad = weight_map(*w2_t, 1);
  } else {
    maps.rows_k = row_tile_map((mx ? *rows_k : rows).data_ptr(), buffer_rows, H, H);
    maps.w1_k = expert_weight_map(w1.data_ptr(), E, F1, H, w1.stride(0), w1.stride(1), halves);
    maps.dout_rows = row_tile_map((mx ? *dout_k : dout).data_ptr(), buffer_rows, H, H);
    maps.w2_dgrad =
        mx ? expert_weight_map(w2_t->data_ptr(), E, F, H, F * H, H, 1, kDgrad2Cols)
           : expert_weight_mn_map(w2.data_ptr(), E, H, F, w2.stride(0), w2.stride(1));
    maps.dh_rows = row_tile_map((mx ? *dh_k : dh).data_ptr(), buffer_rows, F1, F1);
    maps.w1_dgrad =
        mx ? expert_weight_map(w1_t->data_ptr(), E, H, F1, H * F1, F1, 1)
           : expert_weight_mn_map(w1.data_ptr(), E, F1, H, w1.stride(0), w1.stride(1));
  }
  maps.act_store = staged_rows_map(act.data_ptr(), buffer_rows, F, 1, F);
  maps.h_tile = staged_rows_map(h.data_ptr(), buffer_rows, F, halves, F1);
  maps.h_part = staged_rows_map(h.data_ptr(), buffer_rows, F, halves, F1, kDgrad2PartRows);
  maps.dh_part = staged_rows_map(dh.data_ptr(), buffer_rows, F, halves, F1, kDgrad2PartRows);
  maps.dout_mn = mn_major_rows_map(dout.data_ptr(), buffer_rows, H, H);
  maps.act_mn = mn_major_rows_map(act.data_ptr(), buffer_rows, F, F);
  maps.dh_mn = mn_major_rows_map(dh.data_ptr(), buffer_rows, F1, F1);
  maps.rows_mn = mn_major_rows_map(rows.data_ptr(), buffer_rows, H, H);
  if (dw2) maps.dw2_store = staged_rows_map(dw2->data_ptr(), E * H, F, 1, F);
  if (dw1) maps.dw1_store = staged_rows_map(dw1->data_ptr(), E * F1, H, 1, H);
  const bool diagnostic = trace.has_value();
  if (blockwise) {
    MOK_DISPATCH_ACTIVATION(
        activation, KACT,
        (launch_backward<KACT, kBackwardFp8Blockwise>(diagnostic, maps, args)));
  } else if (mx) {
    MOK_DISPATCH_ACTIVATION(activation, KACT,
                            (launch_backward<KACT, kBackwardMxfp8>(diagnostic, maps, args)));
  } else {
    MOK_DISPATCH_ACTIVATION(activation, KACT,
                            (launch_backward<KACT, kBackwardBf16>(diagnostic, maps, args)));
  }
}

}  // namespace mok
