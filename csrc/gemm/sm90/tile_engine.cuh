// The sm90 GEMM tile engine's building blocks, shared by the grouped GEMM launch
// (gemm/grouped_gemm.cu) and the forward megakernel (megakernel/moe_forward.cu):
// the expert-major tile table, the TMA producer and wgmma consumer k-loops over a shared
// stage ring. The epilogue that stores a finished tile is gemm/sm90/tile_epilogue.cuh.
//
// A tile is kGemmBlockM rows x kGemmBlockN columns; consumer warpgroup c owns rows
// 64c .. 64c + 63 and holds them as m64n256 fp32 accumulators. With a gated activation the
// 256 columns are 128 gate + the matching 128 up columns of W1.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "config/kernel_config.cuh"
#include "epilogue/activation_math.cuh"
#include "gemm/sm90/cluster.cuh"
#include "gemm/sm90/tma.cuh"
#include "gemm/sm90/wgmma.cuh"

namespace mok::sm90 {

constexpr int kPlain = -1;  // epilogue id: no activation
constexpr int kATileBytes = kGemmBlockM * kGemmBlockK * 2;
constexpr int kBTileBytes = kGemmBlockN * kGemmBlockK * 2;
constexpr int kAccRegs = kGemmBlockN / 2;  // m64 x n256 fp32 over 128 threads

// Timeout report roles (where a bounded wait gave up).
enum WaitRole : int {
  kWaitProducer = 0,
  kWaitMma = 1,
  kWaitRowsReady = 2,
  kWaitFc1Done = 3,
  kWaitPullSlot = 4,  // row puller: a ring slot to load into
  kWaitPullRow = 5,   // row puller: a loaded row to store
  kWaitTileQueue = 6, // megakernel: a tile index from / a free entry in the block's tile queue
  kWaitRingSlot = 7,  // row puller: FC2 of the macrobatch before to free its ring slot
};
constexpr int kReportInts = 4;  // {role, block, tile, stage}

template <int kAct>
constexpr bool gated_epilogue() {
  if constexpr (kAct == kPlain) return false;
  else return is_gated(kAct);
}

// Output columns one tile of kTileN weight rows produces.
template <int kAct, int kTileN = kGemmBlockN>
constexpr int tile_cols() {
  return gated_epilogue<kAct>() ? kTileN / 2 : kTileN;
}

// kStages operand stages: an A tile (kGemmBlockM x kGemmBlockK) and a B tile (kTileN weight
// rows x kGemmBlockK) each; `full` completes when a stage's TMA loads have landed, `empty`
// when its consumers are done reading it.
template <int kTileN, int kStages>
struct OperandRing {
  static constexpr int kNumStages = kStages;
  static constexpr int kBBytes = kTileN * kGemmBlockK * 2;
  static constexpr int kBytesPerStage = kATileBytes + kBBytes;
  uint8_t a[kStages][kATileBytes];  // each 1024-aligned: the swizzle atom
  uint8_t b[kStages][kBBytes];
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
using StageRing = OperandRing<kGemmBlockN, kGemmStages>;  // the cooperative tile's

struct TileCoord {
  int expert, m_block, n_block;
};

// The last e in [0, num_experts) with begin[e] <= x, for an ascending prefix table `begin`
// (so experts with nothing in them are skipped).
__device__ __forceinline__ int expert_at(const int32_t* begin, int num_experts, int x) {
  int lo = 0, hi = num_experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (begin[mid] <= x) lo = mid; else hi = mid;
  }
  return lo;
}

// Tile `tile` of the expert-major order (expert, m-block, n-block; n fastest). Expert e's
// tiles are mblock_begin[e] * n_blocks .. mblock_begin[e + 1] * n_blocks, so the m-block
// table (build_mblock_table) is the only table needed.
__device__ __forceinline__ TileCoord decode_tile(const int32_t* mblock_begin, int num_experts,
                                                 int n_blocks, int tile) {
  const int mblock = tile / n_blocks;
  const int e = expert_at(mblock_begin, num_experts, mblock);
  return {e, mblock - mblock_begin[e], tile - mblock * n_blocks};
}

// Issues the B-operand TMA loads of one stage (see expert_weight_map): a gated FC1 tile gets
// its gate rows in the first half and the matching up rows in the second half.
template <bool kGatedWeights, int kBBytes = kBTileBytes>
__device__ __forceinline__ void load_weight_tile(uint8_t* b, const CUtensorMap* map,
                                                 uint64_t* full, int k0, int n0, int expert) {
  tma_load_4d(b, map, full, k0, n0, 0, expert);
  if constexpr (kGatedWeights) tma_load_4d(b + kBBytes / 2, map, full, k0, n0, 1, expert);
}

// The table build_mblock_table fills, and the translations between schedule rows and
// m-blocks that every user of it needs.
struct MBlockTable {
  const int32_t* row_begin;     // [E + 1] expert row ranges
  const int32_t* mblock_begin;  // [E + 1] first global m-block of each expert
  int num_experts;

  __device__ int expert_of_mblock(int mblock) const {
    return expert_at(mblock_begin, num_experts, mblock);
  }
  __device__ int expert_of_row(int r) const { return expert_at(row_begin, num_experts, r); }
  // First schedule row of m-block `mblock`, which belongs to expert e.
  __device__ int first_row(int mblock, int e) const {
    return row_begin[e] + (mblock - mblock_begin[e]) * kGemmBlockM;
  }
  // The m-block of schedule row r, which belongs to expert e.
  __device__ int mblock_of_row(int r, int e) const {
    return mblock_begin[e] + (r - row_begin[e]) / kGemmBlockM;
  }
};

// One warp: `row_begin[e]` = offsets[e] and `mblock_begin[e]` = the exclusive prefix sum of
// ceil(rows_e / kBlockRows), the first m-block of expert e, for e in [0, E] (a cluster pair
// of m-blocks counts as one block of 2 kGemmBlockM rows).
template <int kBlockRows = kGemmBlockM>
__device__ __forceinline__ void build_mblock_table(const int32_t* offsets, int num_experts,
                                                   int32_t* row_begin, int32_t* mblock_begin) {
  const int lane = threadIdx.x % 32;
  int carry = 0;
  for (int base = 0; base <= num_experts; base += 32) {
    const int e = base + lane;
    int blocks = 0;
    if (e <= num_experts) {
      const int begin = offsets[e];
      row_begin[e] = begin;
      if (e < num_experts) blocks = (offsets[e + 1] - begin + kBlockRows - 1) / kBlockRows;
    }
    int incl = blocks;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    if (e <= num_experts) mblock_begin[e] = carry + incl - blocks;
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
}

// A persistent kernel's dynamic shared memory laid out as `Storage` from a 1024-byte boundary
// (TMA's 128-byte swizzle atom); launch with aligned_smem_bytes<Storage>().
template <class Storage>
constexpr size_t aligned_smem_bytes() {
  return sizeof(Storage) + 1024;
}
template <class Storage>
__device__ __forceinline__ Storage& aligned_smem(uint8_t* raw) {
  return *reinterpret_cast<Storage*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                     ~uintptr_t(1023));
}

// `readers`: consumer warpgroups that read each stage (and arrive on its `empty`).
template <class Ring>
__device__ __forceinline__ void init_ring(Ring& ring, int readers = kGemmConsumers) {
  for (int i = 0; i < Ring::kNumStages; ++i) {
    mbar_init(&ring.full[i], 1);
    mbar_init(&ring.empty[i], readers);
  }
  fence_barrier_init();
}

// Producer side of one tile: for each k-block, wait for a free stage and issue
// `load(stage, k0)`, which must start TMA loads of exactly Ring::kBytesPerStage onto
// ring.full[stage]. `it` counts k-blocks over the whole launch (stage = it % stages, parity
// flips per wrap).
template <class Ring, class Load>
__device__ __forceinline__ void produce_tile(Ring& ring, int& it, int k_blocks, int tile,
                                             uint64_t timeout_ns, int* report, Load load) {
  constexpr int kStages = Ring::kNumStages;
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kStages;
    const uint32_t parity = (it / kStages) & 1;
    mbar_wait(&ring.empty[stage], parity ^ 1, timeout_ns, kWaitProducer, tile, stage, report);
    mbar_arrive_expect_tx(&ring.full[stage], Ring::kBytesPerStage);
    load(stage, kb * kGemmBlockK);
  }
}

// Consumer side of one tile: acc = A[rows of this warpgroup] @ B^T over k_blocks. A stage is
// released to the producers of kClusterCtas CTAs (1: this CTA's; 2: both of a cluster that
// multicasts its loads).
template <int kClusterCtas = 1>
__device__ __forceinline__ void release_stage(uint64_t* empty) {
  if constexpr (kClusterCtas == 1) {
    mbar_arrive(empty);
  } else {
#pragma unroll
    for (int c = 0; c < kClusterCtas; ++c) mbar_arrive_cluster(empty, c);
  }
}

template <int kClusterCtas = 1>
__device__ __forceinline__ void consume_tile(StageRing& ring, int& it, int k_blocks, int tile,
                                             int consumer, bool leader, float (&acc)[kAccRegs],
                                             uint64_t timeout_ns, int* report) {
  int prev_stage = -1;
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kGemmStages;
    mbar_wait(&ring.full[stage], (it / kGemmStages) & 1, timeout_ns, kWaitMma, tile, stage,
              report);
    const uint64_t desc_a =
        smem_desc_k_major_sw128(ring.a[stage] + consumer * (kATileBytes / kGemmConsumers));
    const uint64_t desc_b = smem_desc_k_major_sw128(ring.b[stage]);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kGemmBlockK / 16; ++k) {
      wgmma_m64n256k16_bf16(acc, desc_advance_k16(desc_a, k), desc_advance_k16(desc_b, k),
                            kb > 0 || k > 0);
    }
    wgmma_commit();
    // Keep one k-block of MMAs in flight; the one before it is done reading its stage.
    wgmma_wait<1>();
    fence_accumulators(acc);
    if (prev_stage >= 0 && leader) release_stage<kClusterCtas>(&ring.empty[prev_stage]);
    prev_stage = stage;
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (prev_stage >= 0 && leader) release_stage<kClusterCtas>(&ring.empty[prev_stage]);
}

// Ping-pong tiles: one warpgroup computes all kGemmBlockM rows of a kPingPongBlockN-column
// tile, as two m64 halves (acc[h]: rows 64h .. 64h + 63).
constexpr int kPingPongAccRegs = kPingPongBlockN / 2;  // m64 x n128 fp32 over 128 threads
using PingPongRing = OperandRing<kPingPongBlockN, kPingPongStages>;

// Consumer side of one ping-pong tile whose k-blocks start at ring position `it` (the two
// warpgroups' tiles alternate in the ring, so each skips the other's k-blocks). `issued()`
// runs once every MMA of the tile is issued, before the last ones are waited for: the other
// warpgroup may start its mainloop then.
template <class Issued>
__device__ __forceinline__ void consume_tile_pingpong(
    PingPongRing& ring, int it, int k_blocks, int tile, bool leader,
    float (&acc)[2][kPingPongAccRegs], uint64_t timeout_ns, int* report, Issued issued) {
  constexpr int kStages = PingPongRing::kNumStages;
  constexpr int kHalfBytes = kATileBytes / 2;  // 64 rows of A: 8 swizzle atoms
  int prev_stage = -1;
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kStages;
    mbar_wait(&ring.full[stage], (it / kStages) & 1, timeout_ns, kWaitMma, tile, stage,
              report);
    const uint64_t desc_a0 = smem_desc_k_major_sw128(ring.a[stage]);
    const uint64_t desc_a1 = smem_desc_k_major_sw128(ring.a[stage] + kHalfBytes);
    const uint64_t desc_b = smem_desc_k_major_sw128(ring.b[stage]);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kGemmBlockK / 16; ++k) {
      const int accumulate = kb > 0 || k > 0;
      wgmma_m64n128k16_bf16(acc[0], desc_advance_k16(desc_a0, k), desc_advance_k16(desc_b, k),
                            accumulate);
      wgmma_m64n128k16_bf16(acc[1], desc_advance_k16(desc_a1, k), desc_advance_k16(desc_b, k),
                            accumulate);
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_accumulators(acc[0]);
    fence_accumulators(acc[1]);
    if (prev_stage >= 0 && leader) mbar_arrive(&ring.empty[prev_stage]);
    prev_stage = stage;
  }
  issued();
  wgmma_wait<0>();
  fence_accumulators(acc[0]);
  fence_accumulators(acc[1]);
  if (prev_stage >= 0 && leader) mbar_arrive(&ring.empty[prev_stage]);
}

}  // namespace mok::sm90
