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
#include "gemm/sm90/tma.cuh"
#include "gemm/sm90/wgmma.cuh"

namespace mok::sm90 {

constexpr int kPlain = -1;  // epilogue id: no activation
constexpr int kATileBytes = kGemmBlockM * kGemmBlockK * 2;
constexpr int kBTileBytes = kGemmBlockN * kGemmBlockK * 2;
constexpr int kStageBytes = kATileBytes + kBTileBytes;
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
  kWaitStaging = 8,   // megakernel epilogue: a staging slot to write / a handoff to store
  kWaitDgradDone = 9, // backward megakernel: FC2-dgrad tiles (dh) of an m-block
  kWaitHTile = 10,    // backward megakernel consumer: its prefetched h tile
  kWaitCarry = 11,    // backward megakernel consumer: the weight-gradient carry of the part before
  kWaitRounded = 12,  // backward megakernel, MXFP8: an m-block's operands rounded (mx_round_tile)
};
constexpr int kReportInts = 4;  // {role, block, tile, stage}

template <int kAct>
constexpr bool gated_epilogue() {
  if constexpr (kAct == kPlain) return false;
  else return is_gated(kAct);
}

// Output columns one tile of kTileN accumulator columns produces.
template <int kAct, int kTileN = kGemmBlockN>
constexpr int tile_cols() {
  return gated_epilogue<kAct>() ? kTileN / 2 : kTileN;
}

struct StageRing {
  uint8_t a[kGemmStages][kATileBytes];  // each 1024-aligned: the swizzle atom
  uint8_t b[kGemmStages][kBTileBytes];
  uint64_t full[kGemmStages];
  uint64_t empty[kGemmStages];
};

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

// Tile `in_span` of a span of one expert's m-blocks [s0, s1) with nb tiles each, taken in
// groups of `group` m-blocks and n-block by n-block inside a group: the tiles that read one
// weight slab run together, and each A slab is read by the group's nb tiles near in time, so
// the CTAs of one wave share both operands in L2. group = 1 is the plain order.
struct GroupedTile {
  int mblock, n_block;
};
__device__ __forceinline__ GroupedTile group_order(int s0, int s1, int nb, int in_span,
                                                   int group) {
  const int g = in_span / (group * nb);
  const int g0 = s0 + g * group;
  const int size = min(group, s1 - g0);
  const int in_group = in_span - g * group * nb;
  return {g0 + in_group % size, in_group / size};
}

// decode_tile's tiles in group_order within each expert: the same index range per expert.
__device__ __forceinline__ TileCoord decode_grouped_tile(const int32_t* mblock_begin,
                                                         int num_experts, int n_blocks,
                                                         int tile, int group) {
  const int e = expert_at(mblock_begin, num_experts, tile / n_blocks);
  const int s0 = mblock_begin[e];
  const GroupedTile g = group_order(s0, mblock_begin[e + 1], n_blocks, tile - s0 * n_blocks,
                                    group);
  return {e, g.mblock - s0, g.n_block};
}

// Issues the B-operand TMA loads of one stage (see expert_weight_map): a gated FC1 tile gets
// its gate rows in the first half and the matching up rows in the second half.
template <bool kGatedWeights>
__device__ __forceinline__ void load_weight_tile(uint8_t* b, const CUtensorMap* map,
                                                 uint64_t* full, int k0, int n0, int expert) {
  tma_load_4d(b, map, full, k0, n0, 0, expert);
  if constexpr (kGatedWeights) tma_load_4d(b + kBTileBytes / 2, map, full, k0, n0, 1, expert);
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
// ceil(rows_e / kGemmBlockM), the first m-block of expert e, for e in [0, E].
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
      if (e < num_experts) blocks = (offsets[e + 1] - begin + kGemmBlockM - 1) / kGemmBlockM;
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

__device__ __forceinline__ void init_ring(StageRing& ring) {
  for (int i = 0; i < kGemmStages; ++i) {
    mbar_init(&ring.full[i], 1);
    mbar_init(&ring.empty[i], kGemmConsumers);
  }
  fence_barrier_init();
}

// Producer side of one tile: for each k-block, wait for a free stage and issue
// `load(stage, k0)`, which must start TMA loads of exactly `stage_bytes` onto ring.full[stage].
// `it` counts k-blocks over the whole launch (stage = it % stages, parity flips per wrap).
template <class Load>
__device__ __forceinline__ void produce_tile(StageRing& ring, int& it, int k_blocks, int tile,
                                             uint64_t timeout_ns, int* report, Load load,
                                             uint32_t stage_bytes = kStageBytes) {
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kGemmStages;
    const uint32_t parity = (it / kGemmStages) & 1;
    mbar_wait(&ring.empty[stage], parity ^ 1, timeout_ns, kWaitProducer, tile, stage, report);
    mbar_arrive_expect_tx(&ring.full[stage], stage_bytes);
    load(stage, kb * kGemmBlockK);
  }
}

// Producer side of one tile without loads (profiling only: the MMAs then read whatever the
// stages hold): each free stage is marked full at once.
__device__ __forceinline__ void signal_tile(StageRing& ring, int& it, int k_blocks, int tile,
                                            uint64_t timeout_ns, int* report) {
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kGemmStages;
    mbar_wait(&ring.empty[stage], ((it / kGemmStages) & 1) ^ 1, timeout_ns, kWaitProducer, tile,
              stage, report);
    mbar_arrive(&ring.full[stage]);
  }
}

// A consumer warpgroup with nothing to compute in this tile (none of its rows exist) still
// owes each stage its release. Only the leader waits and arrives, then the warpgroup meets
// (named barrier `barrier_id`): its other warps must not run ahead into the next tile's
// `full` waits, where a parity wait on a barrier more than one phase behind reads as done.
__device__ __forceinline__ void pass_tile(StageRing& ring, int& it, int k_blocks, int tile,
                                          bool leader, int barrier_id, uint64_t timeout_ns,
                                          int* report) {
  if (leader) {
    for (int kb = 0; kb < k_blocks; ++kb) {
      const int stage = (it + kb) % kGemmStages;
      mbar_wait(&ring.full[stage], ((it + kb) / kGemmStages) & 1, timeout_ns, kWaitMma, tile,
                stage, report);
      mbar_arrive(&ring.empty[stage]);
    }
  }
  it += k_blocks;
  named_barrier_sync(barrier_id, 128);
}

// MN-major operand tiles (gemm/sm90/wgmma.cuh) come as TMA boxes of 64 MN-elements x
// kGemmBlockK K-rows, one per 64 of MN, kMnBoxBytes apart.
constexpr int kMnBoxBytes = 64 * kGemmBlockK * 2;
static_assert(kATileBytes / kGemmConsumers == kMnBoxBytes,
              "a consumer's A rows are one box in either layout");

// TMA loads of an MN-major operand tile: `boxes` boxes at MN = mn0 + 64 b, K = k0, third
// coordinate c2 (the expert of a weight; 0 for rows), into dst + b * kMnBoxBytes.
__device__ __forceinline__ void load_mn_boxes(uint8_t* dst, const CUtensorMap* map,
                                              uint64_t* full, int mn0, int k0, int c2,
                                              int boxes) {
  for (int b = 0; b < boxes; ++b) {
    tma_load_4d(dst + b * kMnBoxBytes, map, full, mn0 + 64 * b, k0, c2, 0);
  }
}

// kN columns into the first kN / 2 of the kAccRegs accumulators.
template <int kN, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_bf16(float (&d)[kAccRegs], uint64_t desc_a, uint64_t desc_b,
                                           int scale_d) {
  static_assert(kN == 256 || kN == 128, "m64n256 or m64n128 tiles");
  if constexpr (kN == 256) wgmma_m64n256k16_bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
  else wgmma_m64n128k16_bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
}

// One k-block of MMAs of a consumer warpgroup: acc (+)= A[its 64 rows] @ B^T over kGemmBlockK,
// each operand K-major or (kAMn / kBMn) MN-major.
template <int kN, bool kAMn, bool kBMn>
__device__ __forceinline__ void mma_k_block(float (&acc)[kAccRegs], const uint8_t* a,
                                            const uint8_t* b, int consumer, bool accumulate) {
  const uint8_t* a_rows = a + consumer * (kATileBytes / kGemmConsumers);
  const uint64_t desc_a = kAMn ? smem_desc_mn_major_sw128(a_rows, kMnBoxBytes)
                               : smem_desc_k_major_sw128(a_rows);
  const uint64_t desc_b =
      kBMn ? smem_desc_mn_major_sw128(b, kMnBoxBytes) : smem_desc_k_major_sw128(b);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kGemmBlockK / 16; ++k) {
    const uint64_t da = kAMn ? desc_advance_mn_major_k16(desc_a, k) : desc_advance_k16(desc_a, k);
    const uint64_t db = kBMn ? desc_advance_mn_major_k16(desc_b, k) : desc_advance_k16(desc_b, k);
    wgmma_bf16<kN, kAMn ? 1 : 0, kBMn ? 1 : 0>(acc, da, db, accumulate || k > 0);
  }
  wgmma_commit();
}

struct NoStageHook {
  __device__ void operator()(int, int) const {}
};

// Consumer side of one tile: acc = A[rows of this warpgroup] @ B^T over k_blocks (kN columns,
// in the first kN / 2 accumulators; operand layouts as mma_k_block), or acc += ... with
// `carry_in` (acc then holds the sums of the k-blocks before: the MMAs go on from them as if
// they had never left the registers). `hook(kb, stage)` runs after the stage has filled and
// before its MMAs are issued (wgrad tiles zero the rows past their expert's end there).
template <int kN = kGemmBlockN, bool kAMn = false, bool kBMn = false, class Hook = NoStageHook>
__device__ __forceinline__ void consume_tile(StageRing& ring, int& it, int k_blocks, int tile,
                                             int consumer, bool leader, float (&acc)[kAccRegs],
                                             uint64_t timeout_ns, int* report,
                                             Hook hook = Hook{}, bool carry_in = false) {
  int prev_stage = -1;
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kGemmStages;
    mbar_wait(&ring.full[stage], (it / kGemmStages) & 1, timeout_ns, kWaitMma, tile, stage,
              report);
    hook(kb, stage);
    mma_k_block<kN, kAMn, kBMn>(acc, ring.a[stage], ring.b[stage], consumer,
                                carry_in || kb > 0);
    // Keep one k-block of MMAs in flight; the one before it is done reading its stage.
    wgmma_wait<1>();
    fence_accumulators(acc);
    if (prev_stage >= 0 && leader) mbar_arrive(&ring.empty[prev_stage]);
    prev_stage = stage;
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  if (prev_stage >= 0 && leader) mbar_arrive(&ring.empty[prev_stage]);
}

}  // namespace mok::sm90
