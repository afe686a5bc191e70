// The backward megakernel: pull dY, FC2-dgrad with the activation backward, dW2, FC1-dgrad
// with dX rows and dprobs pushed to their (token, k) slots, and dW1, in one persistent launch
// (grid = SM count, one block per SM). The mirror of megakernel/moe_forward.cu:
//   tickets [0, comm_blocks)  first pull dY rows (megakernel/row_pull.cuh) from the source
//                             ranks' published buffers (where forward's x was) into `dout`
//                             in schedule order, counted per m-block; then they join the tiles.
//   every block               runs tiles of one index space (megakernel/backward_tiles.cuh),
//                             handed out in increasing order (tile_queue.cuh). The producer
//                             thread waits for a tile's inputs (acquire) and streams its
//                             operands by TMA; the consumer warpgroups run its MMAs and its
//                             epilogue (megakernel/dgrad_epilogue.cuh, gemm/sm90/wgrad.cuh),
//                             each storing and counting its own 64 rows.
// Operands: dgrad reads the weights as stored (N-major B), wgrad reads rows of dY, act, dh and
// x with K = the expert's rows (both operands MN-major); no transposed copies.
// Inputs kept by forward: x rows, h and act at their schedule positions (saved backward
// inputs, or recomputed before the launch), in [cap, .] buffers.
// Deadlock freedom is forward's argument: tiles depend on lower indices or on the pull only.
// Memory ordering is forward's too: async-proxy writes complete (bulk_wait), fence.proxy.async,
// release; readers acquire, fence.proxy.async.global, TMA. Plain stores (an expert's partial
// last block of dh, dprob partials) are fenced by their writers before the release.
// Every output element is computed by one tile in a fixed order: deterministic.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "common/ptx.cuh"
#include "gemm/persistent_launch.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/sm90/wgrad.cuh"
#include "gemm/timeout_report.h"
#include "megakernel/backward_tiles.cuh"
#include "megakernel/dgrad_epilogue.cuh"
#include "megakernel/launch_checks.h"
#include "megakernel/row_pull.cuh"
#include "megakernel/tile_queue.cuh"
#include "ops.h"

namespace mok {
namespace {

using namespace sm90;

struct BackwardMaps {
  CUtensorMap dout_rows;   // dY rows [cap, H], K-major A of FC2-dgrad
  CUtensorMap w2_mn;       // W2 [E, H, F] N-major: B of FC2-dgrad
  CUtensorMap h_tile;      // h [cap, (2,) F]: the FC2-dgrad epilogue's prefetch
  CUtensorMap dh_store;    // dh [cap, (2,) F]: its stores
  CUtensorMap dh_rows;     // dh [cap, F1], K-major A of FC1-dgrad
  CUtensorMap w1_mn;       // W1 [E, F1, H] N-major: B of FC1-dgrad
  CUtensorMap dout_mn;     // dY rows, MN-major A of dW2
  CUtensorMap act_mn;      // act [cap, F], MN-major B of dW2
  CUtensorMap dh_mn;       // dh, MN-major A of dW1
  CUtensorMap rows_mn;     // x rows [cap, H], MN-major B of dW1
  CUtensorMap dw2_store;   // bf16 dW2 [E * H, F] (unused when accumulating into fp32)
  CUtensorMap dw1_store;   // bf16 dW1 [E * F1, H]
};

struct BackwardArgs {
  const int64_t* peer_bases;  // [world] address of each rank's workspace
  int64_t tokens_offset;      // byte offset of the published dY rows [max_tokens, H]
  int64_t slots_offset;       // byte offset of the combine slots [max_tokens * topk, H]
  int64_t values_offset;      // byte offset of the slot values [max_tokens * topk] fp32
  const int32_t* offsets;     // [E + 1] expert row ranges of the schedule
  const int32_t* row_slot;    // [rows] flat (source, token, k) of each row
  const float* row_prob;      // [rows]
  int num_experts, hidden, ffn, f1, per_rank, topk, comm_blocks, world;
  __nv_bfloat16* dout;        // [cap, H] pulled dY rows
  __nv_bfloat16* dh;          // [cap, F1]
  float* dprob_part;          // [cap, F / kDgrad2Cols] per-row dprob partials
  __nv_bfloat16* dw1;         // [E, F1, H] bf16 gradient, or null: dw1_fp32
  __nv_bfloat16* dw2;         // [E, H, F]
  const int64_t* dw1_fp32;    // [E] addresses of fp32 [F1, H] gradients added into, or null
  const int64_t* dw2_fp32;    // [E] of fp32 [H, F]
  uint32_t* rows_ready;       // [m-blocks] dY rows pulled
  uint32_t* dgrad2_done;      // [m-blocks] FC2-dgrad tile halves stored (one per consumer)
  uint32_t* rows_pulled;      // [1] dY rows pulled, all m-blocks
  uint32_t* dgrad2_halves;    // [1] FC2-dgrad tile halves stored, all m-blocks
  uint32_t* tile_counter;     // [1] tiles handed out
  uint32_t* arrivals;         // [1] blocks started (their tickets)
  int minibatch_rows;         // rows the pull publishes at once
  uint64_t timeout_ns;
  int* report;
};

struct SharedStorage {
  EpilogueBuffers epilogue;  // first: 1024-aligned, as TMA's 128-byte swizzle needs
  StageRing ring;
  int32_t row_begin[kGemmMaxExperts + 1];
  int32_t mblock_begin[kGemmMaxExperts + 1];
  uint64_t pull_full[kPullMaxSlots];  // row-pulling blocks: their slots live in epilogue
  uint64_t pull_empty[kPullMaxSlots];  // and ring.a/b until their pull is done
  TileQueue<BackwardTile> queue;
  uint64_t h_full[kGemmConsumers];  // each consumer's prefetched h tile (FC2-dgrad)
  uint32_t ticket;
};
static_assert(offsetof(SharedStorage, ring) == sizeof(EpilogueBuffers),
              "the pull's slots span epilogue, ring.a and ring.b (row_pull.cuh: kPullBytes)");
constexpr size_t kSharedBytes = aligned_smem_bytes<SharedStorage>();
static_assert(kSharedBytes <= kMaxDynamicSmemBytes, "shared memory of one block per SM");

constexpr uint32_t kDgrad2StageBytes = kATileBytes + kDgrad2Cols * kGemmBlockK * 2;

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

template <int kAct>
__global__ void __launch_bounds__(kGemmThreads, 1)
    moe_backward_kernel(const __grid_constant__ BackwardMaps m, const BackwardArgs a) {
  constexpr bool kGated = gated_epilogue<kAct>();
  extern __shared__ uint8_t smem_raw[];
  SharedStorage& s = aligned_smem<SharedStorage>(smem_raw);
  const int E = a.num_experts;
  if (threadIdx.x < 32) build_mblock_table(a.offsets, E, s.row_begin, s.mblock_begin);
  const int slots = pull_slots(a.hidden);
  const PullRing pull_ring{s.epilogue.out[0], s.pull_full, s.pull_empty, slots,
                           min(32, max(1, slots / kPullLanesDivisor))};
  if (threadIdx.x == 32) {
    s.ticket = atomicAdd(a.arrivals, 1u);
    if (s.ticket < a.comm_blocks) init_pull_ring(pull_ring);
    init_tile_queue(s.queue);
    for (int c = 0; c < kGemmConsumers; ++c) mbar_init(&s.h_full[c], 1);
    init_ring(s.ring);
  }
  __syncthreads();
  const int ticket = static_cast<int>(s.ticket);
  const MBlockTable table{s.row_begin, s.mblock_begin, E};
  const int mblocks = s.mblock_begin[E];

  if (ticket < a.comm_blocks) {
    const RowPlacement placement{MacrobatchRing::make(0, 0, mblocks), table, a.minibatch_rows,
                                 nullptr, 0, false, a.timeout_ns, a.report};
    pull_rows_bulk(RowSource{a.peer_bases, a.tokens_offset, a.row_slot, a.per_rank, a.topk,
                             a.world},
                   a.dout, a.hidden, ticket, a.comm_blocks, pull_ring, placement,
                   a.rows_ready, a.rows_pulled);
    // Its rows are pulled (every slot's bulk store has completed): the block's shared memory
    // is free, and it joins the tiles below.
    __syncthreads();
  }

  const BackwardOrder order = BackwardOrder::make(mblocks, E, a.hidden, a.ffn, a.f1);
  const int end_tile = order.end();
  const uint32_t dgrad2_halves = uint32_t(order.nb_dgrad2) * kGemmConsumers;
  auto k_blocks_of = [&](const BackwardTile& w) {
    if (w.kind == kDgrad2) return ceil_div(a.hidden, kGemmBlockK);
    if (w.kind == kDgrad1) return ceil_div(a.f1, kGemmBlockK);
    return ceil_div(w.rows, kGemmBlockK);
  };

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    warpgroup_reg_dealloc<kGemmProducerRegs>();
    if (threadIdx.x != 0) return;
    // The tile's inputs: its m-block's dY rows (FC2-dgrad), its m-block's dh (FC1-dgrad), or
    // the same for every m-block of its expert (dW2, dW1). Tiles after the FC2-dgrad phase
    // usually find their phase's inputs all done: once this thread has seen that (acquire,
    // then the async-proxy fence that orders it for its later TMA loads) it waits for them
    // no more, and a weight-gradient tile of a few k-blocks does not pay an L2 round trip
    // and a fence on the producer's path per tile.
    const uint32_t total_rows = uint32_t(s.row_begin[E]);
    const uint32_t total_halves = uint32_t(mblocks) * dgrad2_halves;
    bool rows_all_seen = false, dh_all_seen = false;
    auto wait_inputs = [&](const BackwardTile& w) {
      bool all_done = false;
      if (w.kind == kWgrad2) {
        if (rows_all_seen) return;  // fenced when first seen
        all_done = rows_all_seen = ld_acquire_gpu_u32(a.rows_pulled) >= total_rows;
      } else if (w.kind != kDgrad2) {
        if (dh_all_seen) return;
        all_done = dh_all_seen = ld_acquire_gpu_u32(a.dgrad2_halves) >= total_halves;
      }
      if (all_done) {
        fence_proxy_async_global();
        return;
      }
      auto wait_mblock = [&](int mb, int rows_from) {
        if (w.kind == kDgrad2 || w.kind == kWgrad2) {
          counter_wait(&a.rows_ready[mb], min(rows_from, kGemmBlockM), a.timeout_ns,
                       kWaitRowsReady, w.tile, mb, a.report);
        } else {
          counter_wait(&a.dgrad2_done[mb], dgrad2_halves, a.timeout_ns, kWaitDgradDone, w.tile,
                       mb, a.report);
        }
      };
      if (w.kind == kDgrad2 || w.kind == kDgrad1) {
        wait_mblock(w.block, w.rows);
      } else {
        const int mb0 = s.mblock_begin[w.expert];
        for (int mb = mb0; mb < s.mblock_begin[w.expert + 1]; ++mb) {
          wait_mblock(mb, w.rows - (mb - mb0) * kGemmBlockM);
        }
      }
      fence_proxy_async_global();
    };
    int it = 0;
    // One index taken ahead, as in forward: the atomic's round trip overlaps this tile's loads.
    int ahead = take_tile(a.tile_counter, end_tile);
    for (int seq = 0;; ++seq) {
      const int tile = ahead;
      if (tile < 0) {
        push_tile(s.queue, seq, BackwardTile{-1}, a.timeout_ns, a.report);
        break;
      }
      ahead = take_tile(a.tile_counter, end_tile);
      const BackwardTile w = backward_tile_at(order, table, tile);
      push_tile(s.queue, seq, w, a.timeout_ns, a.report);
      wait_inputs(w);
      const uint32_t bytes = w.kind == kDgrad2 ? kDgrad2StageBytes : uint32_t(kStageBytes);
      produce_tile(
          s.ring, it, k_blocks_of(w), tile, a.timeout_ns, a.report,
          [&](int stage, int k0) {
            uint64_t* full = &s.ring.full[stage];
            uint8_t* A = s.ring.a[stage];
            uint8_t* B = s.ring.b[stage];
            switch (w.kind) {
              case kDgrad2:
                tma_load_4d(A, &m.dout_rows, full, k0, w.row0, 0, 0);
                load_mn_boxes(B, &m.w2_mn, full, w.n_block * kDgrad2Cols, k0, w.expert,
                              kDgrad2Cols / 64);
                break;
              case kDgrad1:
                tma_load_4d(A, &m.dh_rows, full, k0, w.row0, 0, 0);
                load_mn_boxes(B, &m.w1_mn, full, w.n_block * kGemmBlockN, k0, w.expert,
                              kGemmBlockN / 64);
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
    }
    return;
  }

  warpgroup_reg_alloc<kGemmConsumerRegs>();
  const int consumer = warpgroup - 1;
  const int t = threadIdx.x % 128;
  const bool leader = t == 0;
  uint8_t* buf = s.epilogue.out[consumer];
  const int staging = kStagingBarrier + consumer;
  float acc[kAccRegs];  // FC2-dgrad tiles use the first kDgrad2Cols / 2 (m64n128)
  int it = 0;
  uint32_t h_phase = 0;
  for (int seq = 0;; ++seq) {
    const BackwardTile w = wait_tile(s.queue, seq, a.timeout_ns, a.report);
    release_tile(s.queue, seq);
    if (w.tile < 0) break;
    // The staging buffer is free once this warpgroup's bulk stores of it (any thread's) have
    // read it: waited for where it is next written, so the reads overlap this tile's MMAs.
    auto staging_free = [&] {
      bulk_wait_read<0>();
      named_barrier_sync(staging, 128);
    };
    const int k_blocks = k_blocks_of(w);

    if (w.kind == kDgrad2 || w.kind == kDgrad1) {
      const int row0 = w.row0 + kStagedRows * consumer;
      const int rows_valid = max(0, min(kStagedRows, w.rows - kStagedRows * consumer));
      const bool full = w.rows >= kStagedRows * (consumer + 1);
      if (rows_valid == 0) {
        // An m-block of at most 64 rows is the first warpgroup's alone (tile_engine.cuh).
        pass_tile(s.ring, it, k_blocks, w.tile, leader, staging, a.timeout_ns, a.report);
      } else if (w.kind == kDgrad2) {
        const int col0 = w.n_block * kDgrad2Cols;
        staging_free();
        if (leader) {
          fence_proxy_async_shared();
          prefetch_h_tile<kGated>(buf, &m.h_tile, &s.h_full[consumer], row0, col0);
        }
        float p[2];
        load_row_probs<kAct>(a.row_prob, row0, rows_valid, p);
        consume_tile<kDgrad2Cols, false, true>(s.ring, it, k_blocks, w.tile, consumer, leader,
                                               acc, a.timeout_ns, a.report);
        mbar_wait(&s.h_full[consumer], h_phase, a.timeout_ns, kWaitHTile, w.tile, consumer,
                  a.report);
        h_phase ^= 1;
        float dp[2];
        activation_backward_staged<kAct>(acc, buf, t, p, dp);
        if (t % 4 == 0) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int r = 16 * (t / 32) + (t % 32) / 4 + 8 * i;
            if (r < rows_valid) {
              a.dprob_part[int64_t(row0 + r) * order.nb_dgrad2 + w.n_block] = dp[i];
            }
          }
        }
        fence_proxy_async_shared();
        named_barrier_sync(staging, 128);
        const EpilogueTensor dh{&m.dh_store, a.dh, a.f1};
        for (int half = 0; half < (kGated ? 2 : 1); ++half) {
          const uint8_t* src = buf + half * kHHalfBytes;
          if (full) {
            if (leader) issue_staged_boxes(dh, src, kDgrad2Cols / 64, half, row0, col0, a.ffn);
          } else {
            copy_staged_rows<kDgrad2Cols>(src, dh, half, row0, rows_valid, col0, a.ffn, t, 128);
          }
        }
      } else {
        consume_tile<kGemmBlockN, false, true>(s.ring, it, k_blocks, w.tile, consumer, leader,
                                               acc, a.timeout_ns, a.report);
        staging_free();
        write_scatter_staged(acc, buf, t);
        fence_proxy_async_shared();
        named_barrier_sync(staging, 128);
        if (t < rows_valid) {
          const int col0 = w.n_block * kGemmBlockN;
          const int flat = a.row_slot[row0 + t];
          char* slot = source_slot(a.peer_bases, a.per_rank, flat, a.slots_offset,
                                   int64_t(a.hidden) * 2);
          bulk_store(slot + int64_t(col0) * 2, buf + t * kScatterRowBytes,
                     uint32_t(min(kGemmBlockN, a.hidden - col0)) * 2);
          bulk_commit();
          if (w.n_block == 0) {
            // The row's dprob: its FC2-dgrad tiles' partials (complete: the producer waited
            // for them; acquired here again for this thread's loads), in n-block order.
            ld_acquire_gpu_u32(&a.dgrad2_done[w.block]);
            const float* part = a.dprob_part + int64_t(row0 + t) * order.nb_dgrad2;
            float dprob = 0.f;
            for (int j = 0; j < order.nb_dgrad2; ++j) dprob += part[j];
            *reinterpret_cast<float*>(
                source_slot(a.peer_bases, a.per_rank, flat, a.values_offset, 4)) = dprob;
          }
        }
      }
      if (w.kind == kDgrad2) {
        // dh and the partials are in memory before the m-block is counted: every thread's
        // plain stores (fence, then the barrier), the leader's TMA stores (complete, then
        // ordered for the async proxy of the readers' TMA loads).
        __threadfence();
        named_barrier_sync(staging, 128);
        if (leader) {
          bulk_wait<0>();
          fence_proxy_async_global();
          red_release_gpu_add_u32(&a.dgrad2_done[w.block], 1);
          red_release_gpu_add_u32(a.dgrad2_halves, 1);
        }
      }
      continue;
    }

    // Weight-gradient tile: both warpgroups take every one (KTailZero meets across them).
    const bool wgrad2 = w.kind == kWgrad2;
    if (k_blocks > 0) {
      consume_tile<kGemmBlockN, true, true>(
          s.ring, it, k_blocks, w.tile, consumer, leader, acc, a.timeout_ns, a.report,
          KTailZero<kGemmBlockN / 64>{&s.ring, k_blocks, w.rows - (k_blocks - 1) * kGemmBlockK,
                                      consumer});
    }
    const int M = wgrad2 ? a.hidden : a.f1, N = wgrad2 ? a.ffn : a.hidden;
    const int m0 = w.block * kGemmBlockM + kStagedRows * consumer;
    const int rows_valid = max(0, min(kStagedRows, M - m0));
    const int n0 = w.n_block * kGemmBlockN;
    const int64_t* fp32 = wgrad2 ? a.dw2_fp32 : a.dw1_fp32;
    if (fp32 != nullptr) {
      if (k_blocks > 0) {
        accumulate_fp32(acc, reinterpret_cast<float*>(fp32[w.expert]), m0, n0, rows_valid, N);
      }
    } else if (rows_valid > 0) {
      const EpilogueTensor out{wgrad2 ? &m.dw2_store : &m.dw1_store, wgrad2 ? a.dw2 : a.dw1, N};
      const int row0 = w.expert * M + m0;
      const bool full = m0 + kStagedRows <= M;
      staging_free();
      // An expert without rows has dW = 0, written without touching the accumulators (a
      // non-wgmma write to them makes ptxas serialize every wgmma of the kernel).
      store_round<kGemmBlockN>(buf, out, 0, row0, full, rows_valid, n0, N, consumer, leader,
                               [&](int j, int i) {
                                 return k_blocks > 0
                                            ? __floats2bfloat162_rn(acc[4 * j + 2 * i],
                                                                    acc[4 * j + 2 * i + 1])
                                            : __floats2bfloat162_rn(0.f, 0.f);
                               });
    }
  }
  bulk_wait<0>();  // this thread's stores (peers' slots among them) complete before exit
}

template <int kAct>
void launch_backward(const BackwardMaps& maps, const BackwardArgs& args) {
  launch_persistent(moe_backward_kernel<kAct>, kSharedBytes, maps, args);
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
                             int64_t slots_offset, int64_t values_offset,
                             const at::Tensor& offsets, const at::Tensor& row_slot,
                             const at::Tensor& row_prob, int64_t max_tokens, int64_t topk,
                             const at::Tensor& w1, const at::Tensor& w2, int64_t activation,
                             const at::Tensor& rows, const at::Tensor& h, const at::Tensor& act,
                             at::Tensor& dout, at::Tensor& dh, at::Tensor& dprob_part,
                             const c10::optional<at::Tensor>& dw1,
                             const c10::optional<at::Tensor>& dw2,
                             const c10::optional<at::Tensor>& dw1_fp32,
                             const c10::optional<at::Tensor>& dw2_fp32, at::Tensor& counters,
                             int64_t comm_blocks, int64_t minibatch_rows, int64_t timeout_ns,
                             int64_t rank) {
  const int64_t E = w1.size(0), H = rows.size(1), F = w2.size(2);
  const bool gated = is_gated(static_cast<int>(activation));
  const int64_t F1 = gated ? 2 * F : F;
  const int64_t cap = row_slot.numel();
  const int64_t max_mblocks = max_schedule_mblocks(cap, E);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  check_megakernel_call("moe_backward_megakernel", w1, w2, offsets, peer_bases, H, F1,
                        minibatch_rows);
  auto rows_of = [&](const at::Tensor& t, int64_t width) {
    return t.is_cuda() && t.scalar_type() == at::kBFloat16 && t.is_contiguous() &&
           t.dim() == 2 && t.size(0) == cap && t.size(1) == width;
  };
  MOK_HOST_CHECK(rows_of(rows, H) && rows_of(h, F1) && rows_of(act, F) && rows_of(dout, H) &&
                     rows_of(dh, F1),
                 "moe_backward_megakernel: rows and dout [", cap, ", H], h and dh [", cap,
                 ", F1], act [", cap, ", F]: contiguous bf16 GPU tensors");
  const int64_t nb_dgrad2 = (F + kDgrad2Cols - 1) / kDgrad2Cols;
  MOK_HOST_CHECK(dprob_part.is_cuda() && dprob_part.scalar_type() == at::kFloat &&
                     dprob_part.is_contiguous() && dprob_part.numel() >= cap * nb_dgrad2,
                 "moe_backward_megakernel: dprob_part must be fp32 with >= ", cap * nb_dgrad2,
                 " values");
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
  MOK_HOST_CHECK(counters.scalar_type() == at::kInt && counters.is_contiguous() &&
                     counters.numel() >= 2 * max_mblocks + 4,
                 "moe_backward_megakernel: counters must be int32 with >= ",
                 2 * max_mblocks + 4, " zeros");
  MOK_HOST_CHECK(comm_blocks >= 1 && comm_blocks < sms, "moe_backward_megakernel: comm_blocks ",
                 comm_blocks, " must be in [1, ", sms - 1, "]");
  c10::cuda::CUDAGuard guard(rows.device());

  BackwardArgs args{};
  args.peer_bases = peer_bases.data_ptr<int64_t>();
  args.tokens_offset = tokens_offset;
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
  args.dout = reinterpret_cast<__nv_bfloat16*>(dout.data_ptr());
  args.dh = reinterpret_cast<__nv_bfloat16*>(dh.data_ptr());
  args.dprob_part = dprob_part.data_ptr<float>();
  args.dw1 = dw1 ? reinterpret_cast<__nv_bfloat16*>(dw1->data_ptr()) : nullptr;
  args.dw2 = dw2 ? reinterpret_cast<__nv_bfloat16*>(dw2->data_ptr()) : nullptr;
  args.dw1_fp32 = fp32_grads(dw1_fp32, E, "dw1_fp32");
  args.dw2_fp32 = fp32_grads(dw2_fp32, E, "dw2_fp32");
  args.rows_ready = reinterpret_cast<uint32_t*>(counters.data_ptr<int32_t>());
  args.dgrad2_done = args.rows_ready + max_mblocks;
  args.rows_pulled = args.dgrad2_done + max_mblocks;
  args.dgrad2_halves = args.rows_pulled + 1;
  args.tile_counter = args.dgrad2_halves + 1;
  args.arrivals = args.tile_counter + 1;
  args.minibatch_rows = static_cast<int>(minibatch_rows);
  args.timeout_ns = static_cast<uint64_t>(timeout_ns);
  args.report = timeout_report_device(kReportBackwardMegakernel, rank, timeout_ns);

  BackwardMaps maps{};
  maps.dout_rows = row_tile_map(dout.data_ptr(), cap, H, H);
  maps.w2_mn = expert_weight_mn_map(w2.data_ptr(), E, H, F, w2.stride(0), w2.stride(1));
  maps.h_tile = staged_rows_map(h.data_ptr(), cap, F, gated ? 2 : 1, F1);
  maps.dh_store = staged_rows_map(dh.data_ptr(), cap, F, gated ? 2 : 1, F1);
  maps.dh_rows = row_tile_map(dh.data_ptr(), cap, F1, F1);
  maps.w1_mn = expert_weight_mn_map(w1.data_ptr(), E, F1, H, w1.stride(0), w1.stride(1));
  maps.dout_mn = mn_major_rows_map(dout.data_ptr(), cap, H, H);
  maps.act_mn = mn_major_rows_map(act.data_ptr(), cap, F, F);
  maps.dh_mn = mn_major_rows_map(dh.data_ptr(), cap, F1, F1);
  maps.rows_mn = mn_major_rows_map(rows.data_ptr(), cap, H, H);
  if (dw2) maps.dw2_store = staged_rows_map(dw2->data_ptr(), E * H, F, 1, F);
  if (dw1) maps.dw1_store = staged_rows_map(dw1->data_ptr(), E * F1, H, 1, H);
  MOK_DISPATCH_ACTIVATION(activation, KACT, launch_backward<KACT>(maps, args));
}

}  // namespace mok
