// The FP8 tile engine's stage ring and k-loops (gemm/fp8_grouped_gemm.cu, and the forward
// megakernel's tiles under the blockwise recipe, megakernel/moe_forward.cu): E4M3 operands with
// power-of-two scales, one per 1 x kScaleK of an activation row and one per 128 x 128 block of
// a weight (Fp8BlockScales: the blockwise recipe). MXFP8 runs on the engine that dequantizes
// weight codes in shared memory instead (gemm/sm90/mx_weight_stage.cuh): promoting per 32 of K
// with a row x column scale per accumulator cost more than the conversion (docs/perf-log.md, MXFP8, 2026-12-03/04).
//
// A stage is 128 codes of K: the A tile (kGemmBlockM rows), the B tile (kFp8BlockN weight
// rows), both 128-byte swizzled by TMA, the A rows' scale codes of the stage's scale blocks,
// and the weight blocks' scales of the B tile's 32-row groups, decoded to fp32 by the producer.
// A consumer warpgroup multiplies its 64 rows one scale block at a time (k32 wgmmas into fresh
// partial sums) and adds the partial sums to its fp32 accumulators times (row scale x weight
// scale) on the CUDA cores: the tensor cores' own accumulation never spans more than one scale
// block.
#pragma once

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/cluster.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tma.cuh"
#include "gemm/sm90/wgmma.cuh"
#include "quant/fp8_rows.h"
#include "quant/mx_format.cuh"

namespace mok::sm90 {

// The blockwise recipe: 1 x 128 row scales, one scale per 128 x 128 weight block (read from
// global memory, [E, ceil(N / 128), ceil(K / 128)] E8M0).
struct Fp8BlockScales {
  static constexpr int kScaleK = kFp8ScaleBlock;
};

// A stage's weight scales: one fp32 factor per 32 weight rows of its B tile (the widest tile's
// six, padded to whole 16-byte stores).
constexpr int kWeightGroupRows = 32;
constexpr int kStageGroupScales = 8;
static_assert(kFp8WideBlockN / kWeightGroupRows <= kStageGroupScales, "the widest tile's groups");

constexpr int kFp8ATileBytes = kGemmBlockM * kFp8BlockK;  // one byte per code
constexpr int kFp8BTileBytes = kFp8BlockN * kFp8BlockK;
constexpr int kFp8AccRegs = kFp8BlockN / 2;  // m64 x n128 fp32 over 128 threads
static_assert(kFp8BlockK == 128, "a stage's rows are one 128-byte swizzle row of codes");

// kStages: the grouped GEMM takes the deepest ring that fits beside its staging and expert
// tables (gemm/fp8_grouped_gemm.cu); the forward megakernel fits fewer (megakernel/moe_forward.cu).
// kTileN: the B tile's weight rows - kFp8BlockN, or kFp8WideBlockN for the grouped GEMM's
// wide tiles; the consumers take their tile width from it.
template <class Scales, int kStages, int kTileN_ = kFp8BlockN>
struct Fp8StageRing {
  static constexpr int kTileN = kTileN_;
  static constexpr int kStageCount = kStages;
  static constexpr int kScaleBlocks = kFp8BlockK / Scales::kScaleK;  // per stage
  static constexpr int kRowScaleBytes = kFp8RowScaleBox * kScaleBlocks;
  static constexpr int kBTileBytes = kTileN * kFp8BlockK;
  static constexpr uint32_t kTxBytes = kFp8ATileBytes + kBTileBytes + kRowScaleBytes;

  // A stage's scale slot: the rows' E8M0 codes, then (in the slot's padding) the weight
  // groups' fp32 scales.
  static constexpr int kGroupScalesAt = (kRowScaleBytes + 15) / 16 * 16;
  static constexpr bool kGroupScalesInTmaBytes = false;  // no TMA load writes them
  static constexpr int kScaleSlotBytes =
      (kGroupScalesAt + kStageGroupScales * 4 + 127) / 128 * 128;

  uint8_t a[kStages][kFp8ATileBytes];  // each 1024-aligned: the swizzle atom
  uint8_t b[kStages][kBTileBytes];
  alignas(128) uint8_t a_scales[kStages][kScaleSlotBytes];
  uint64_t full[kStages];
  uint64_t empty[kStages];

  __device__ float* group_scales(int stage) {
    return reinterpret_cast<float*>(a_scales[stage] + kGroupScalesAt);
  }
};

// The FP8 engine's stages laid over the tile engine's ring (tile_engine.cuh: StageRing), for a
// launch whose FP8 tiles and BF16 tiles take turns (the backward megakernel under the blockwise
// recipe): a stage's A codes in its A tile, its B codes in the first half of its B tile, the
// row scales after them and the weight groups' scales after those; the ring's barriers, stage
// count and k-block counter `it`, so a tile of either engine follows one of the other without
// draining the ring.
struct StageBytes {
  uint8_t* first;
  int stride;
  __device__ uint8_t* operator[](int stage) const { return first + stage * stride; }
};

struct Fp8RingOverStages {
  static constexpr int kTileN = kFp8BlockN;
  static constexpr int kStageCount = kGemmStages;
  static constexpr int kScaleBlocks = kFp8BlockK / kFp8ScaleBlock;
  static constexpr uint32_t kTxBytes =
      kFp8ATileBytes + kFp8BTileBytes + kFp8RowScaleBox * kScaleBlocks;

  static constexpr int kGroupScalesAt = kFp8BTileBytes + 256;  // in the B tile
  // The BF16 tiles' B loads write these bytes too: the producer's stores are fenced before
  // its later TMA loads (a write by the generic proxy, then one by the async proxy).
  static constexpr bool kGroupScalesInTmaBytes = true;

  StageBytes a, b, a_scales, w_group_scales;
  uint64_t* full;
  uint64_t* empty;

  __device__ static Fp8RingOverStages over(StageRing& ring) {
    return {{ring.a[0], kATileBytes},
            {ring.b[0], kBTileBytes},
            {ring.b[0] + kFp8BTileBytes, kBTileBytes},
            {ring.b[0] + kGroupScalesAt, kBTileBytes},
            ring.full,
            ring.empty};
  }
  __device__ float* group_scales(int stage) const {
    return reinterpret_cast<float*>(w_group_scales[stage]);
  }
};
static_assert(kFp8ATileBytes <= kATileBytes && kFp8BTileBytes % 1024 == 0 &&
                  kFp8RowScaleBox <= Fp8RingOverStages::kGroupScalesAt - kFp8BTileBytes &&
                  Fp8RingOverStages::kGroupScalesAt + kStageGroupScales * 4 <= kBTileBytes,
              "an FP8 stage fits a tile-engine stage: its B tile swizzle-atom aligned, the row "
              "scales 128-byte aligned after it and the weight groups' scales after them");

// kCtas: the CTAs whose consumers release each stage (2 when a pair's producers both write it:
// gemm/sm90/cluster.cuh).
template <int kCtas = 1, class Ring>
__device__ __forceinline__ void init_fp8_ring(Ring& ring) {
  for (int i = 0; i < Ring::kStageCount; ++i) {
    mbar_init(&ring.full[i], 1);
    // Each consumer's leader of each CTA that reads it, after its MMAs.
    mbar_init(&ring.empty[i], kGemmConsumers * kCtas);
  }
  fence_barrier_init();
}

// How a consumer's leader gives a stage back: to this CTA's producer, or (PairRelease) to both
// producers of a pair, whose multicasts both land in each CTA's stage.
struct LocalRelease {
  __device__ void operator()(uint64_t* empty) const { mbar_arrive(empty); }
};
struct PairRelease {
  uint32_t peer;
  __device__ void operator()(uint64_t* empty) const {
    mbar_arrive(empty);
    mbar_arrive_remote(empty, peer);
  }
};

// A stacked weight's block scales as the kernels take them: E8M0 codes [E, row_blocks,
// k_blocks], one per 128 x 128 block, and the rows of one half (a gated weight's gate or up
// rows; all of them otherwise).
struct Fp8Weights {
  const uint8_t* scales;
  int row_blocks, half_rows;
};

// The weight-block scales of a tile (blockwise), which its producer decodes per k-block
// into each stage's 32-row group scales: for every k-block, the E8M0 codes of the block
// holding the tile's first kFp8BlockN / halves rows of each half. A wide (kFp8WideBlockN-row) plain tile
// (n0 a multiple of 192, so of 64) spans two blocks: half0 is the one its first rows are in,
// half1 the next (the last block again past the weight's rows), and `wide_first` says the
// first block holds 128 of its rows (n0 % 128 == 0), else 64. (A wide gated tile: the
// specialization below.)
template <bool kGatedWeights, int kTileN = kFp8BlockN>
struct WeightBlockScales {
  static constexpr int kCodes = 2;  // per k-block
  static constexpr int kGroups = kTileN / kWeightGroupRows;
  const uint8_t* half0;
  const uint8_t* half1;
  bool wide_first;

  __device__ WeightBlockScales(const Fp8Weights& w, int expert, int k_blocks, int n0) {
    const uint8_t* e = w.scales + int64_t(expert) * w.row_blocks * k_blocks;
    const int first = n0 / kFp8ScaleBlock;
    half0 = e + first * k_blocks;
    if constexpr (kTileN == kFp8WideBlockN) {
      half1 = e + min(first + 1, w.row_blocks - 1) * k_blocks;
    } else {
      half1 = kGatedWeights ? e + ((w.half_rows + n0) / kFp8ScaleBlock) * k_blocks : half0;
    }
    wide_first = n0 % kFp8ScaleBlock == 0;
  }

  __device__ void load(int kb, uint8_t (&codes)[kCodes]) const {
    codes[0] = __ldg(half0 + kb);
    codes[1] = __ldg(half1 + kb);
  }

  // The factor of each 32-row group: groups 0-1 in the first block and the last two in the
  // second; 2-3 in the second on a 128-row tile (a gated tile's up half), on a wide one in the
  // block it holds 128 rows of (wide_first).
  __device__ void group_factors(const uint8_t (&codes)[kCodes], float (&g)[kGroups]) const {
    const float first = e8m0_factor(codes[0]), second = e8m0_factor(codes[1]);
    const float mid = kTileN == kFp8WideBlockN && wide_first ? first : second;
#pragma unroll
    for (int grp = 0; grp < kGroups; ++grp) g[grp] = grp < 2 ? first : grp < 4 ? mid : second;
  }
};

// A wide gated tile: 96 gate rows from n0 (a multiple of 96, so of 32) and the 96 up rows
// half_rows further (F, a multiple of 64). Each half spans up to two 128-row blocks, in
// 32-row groups that never straddle one: codes [gate's first block, the next, up's first, the
// next] per k-block (a next block past the weight's rows is the last again: its rows read as
// zero), and bit g of `second` says group g (gate 0-2, up 3-5) is in its half's next block.
template <>
struct WeightBlockScales<true, kFp8WideBlockN> {
  static constexpr int kCodes = 4;
  static constexpr int kGroups = kFp8WideBlockN / kWeightGroupRows;
  const uint8_t* block[kCodes];
  uint32_t second;

  __device__ WeightBlockScales(const Fp8Weights& w, int expert, int k_blocks, int n0) {
    const uint8_t* e = w.scales + int64_t(expert) * w.row_blocks * k_blocks;
    second = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = h * w.half_rows + n0, first = row / kFp8ScaleBlock;
      block[2 * h] = e + first * k_blocks;
      block[2 * h + 1] = e + min(first + 1, w.row_blocks - 1) * k_blocks;
#pragma unroll
      for (int g = 1; g < 3; ++g) {
        if ((row + 32 * g) / kFp8ScaleBlock != first) second |= 1u << (3 * h + g);
      }
    }
  }

  __device__ void load(int kb, uint8_t (&codes)[kCodes]) const {
#pragma unroll
    for (int c = 0; c < kCodes; ++c) codes[c] = __ldg(block[c] + kb);
  }

  // Group g's factor: its half's first or next block (`second`).
  __device__ void group_factors(const uint8_t (&codes)[kCodes], float (&g)[kGroups]) const {
#pragma unroll
    for (int grp = 0; grp < kGroups; ++grp) {
      const int c = 2 * (grp / 3) + (second >> grp & 1u);
      g[grp] = e8m0_factor(codes[c]);
    }
  }
};

// A stage's group scales: written by the producer before the arrive that, with TMA's bytes,
// completes the stage (its release orders them for the consumers' acquiring wait), and read
// by the consumers as two vector loads at the stage's fixed offset.
template <int kGroups>
__device__ __forceinline__ void store_group_scales(float* p, const float (&g)[kGroups]) {
  static_assert(kGroups == 4 || kGroups == 6, "128 or 192 weight rows");
  st_shared_f32x4(p, g[0], g[1], g[2], g[3]);
  if constexpr (kGroups == 6) st_shared_f32x2(p + 4, g[4], g[5]);
}

template <int kGroups>
__device__ __forceinline__ void load_group_scales(const float* p, float (&g)[kGroups]) {
  static_assert(kGroups == 4 || kGroups == 6, "128 or 192 weight rows");
  ld_shared_f32x4(p, g[0], g[1], g[2], g[3]);
  if constexpr (kGroups == 6) ld_shared_f32x2(p + 4, g[4], g[5]);
}

// The producer's start of k-block kb (ring counter it): waits until the stage is free, stores
// the weight groups' scales `w_group`, arms its full barrier for the stage's bytes and loads
// the A codes at (k0, row0) and the A rows' scale codes of the stage's blocks; returns the
// stage.
template <class Ring, int kGroups>
__device__ __forceinline__ int start_fp8_stage(Ring& ring, int it, int kb, int tile,
                                               const CUtensorMap* a_map,
                                               const CUtensorMap* a_scales_map, int row0,
                                               const float (&w_group)[kGroups],
                                               uint64_t timeout_ns, int* report) {
  const int stage = it % Ring::kStageCount;
  mbar_wait(&ring.empty[stage], ((it / Ring::kStageCount) & 1) ^ 1, timeout_ns, kWaitProducer,
            tile, stage, report);
  store_group_scales(ring.group_scales(stage), w_group);
  if constexpr (Ring::kGroupScalesInTmaBytes) fence_proxy_async_shared();
  uint64_t* full = &ring.full[stage];
  mbar_arrive_expect_tx(full, Ring::kTxBytes);
  tma_load_4d(ring.a[stage], a_map, full, kb * kFp8BlockK, row0, 0, 0);
  tma_load_4d(ring.a_scales[stage], a_scales_map, full,
              row0 / kFp8RowScaleAlign * kFp8RowScaleAlign, kb * Ring::kScaleBlocks, 0, 0);
  return stage;
}

// A producer's weight group scales for each k-block of the tile at (expert, n0): block
// kb + 1's codes are read while kb's stage is waited for.
template <class Scales>
struct GroupScaleStream {
  const Scales& ws;
  int k_blocks;
  uint8_t codes[Scales::kCodes];

  __device__ GroupScaleStream(const Scales& s, int kbs) : ws(s), k_blocks(kbs) {
    ws.load(0, codes);
  }
  __device__ void next(int kb, float (&g)[Scales::kGroups]) {
    ws.group_factors(codes, g);
    if (kb + 1 < k_blocks) ws.load(kb + 1, codes);
  }
};

// Producer side of one tile (tile_engine.cuh: produce_tile, over the FP8 ring): per k-block the
// weight groups' scales (from w_scales), the A codes and row scales (start_fp8_stage) and the
// weight rows' codes of expert e.
template <bool kGatedWeights, class Ring>
__device__ __forceinline__ void produce_fp8_tile(Ring& ring, int& it, int k_blocks, int tile,
                                                 const CUtensorMap* a_map,
                                                 const CUtensorMap* a_scales_map,
                                                 const CUtensorMap* w_map,
                                                 const Fp8Weights& w_scales, int row0, int n0,
                                                 int expert, uint64_t timeout_ns, int* report) {
  using Scales = WeightBlockScales<kGatedWeights, Ring::kTileN>;
  const Scales ws(w_scales, expert, k_blocks, n0);
  GroupScaleStream<Scales> scales(ws, k_blocks);
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    float g[Scales::kGroups];
    scales.next(kb, g);
    const int stage =
        start_fp8_stage(ring, it, kb, tile, a_map, a_scales_map, row0, g, timeout_ns, report);
    uint64_t* full = &ring.full[stage];
    const int k0 = kb * kFp8BlockK;
    tma_load_4d(ring.b[stage], w_map, full, k0, n0, 0, expert);
    if constexpr (kGatedWeights) {
      tma_load_4d(ring.b[stage] + Ring::kTileN * kFp8BlockK / 2, w_map, full, k0, n0, 1, expert);
    }
  }
}

// produce_fp8_tile for a CTA of a pair (rank 0 or 1): its own A rows and row scales, and the B
// tile as two boxes of half its rows (w_half_map) - with `shared_b` (both CTAs' tiles read the
// same weight rows) box `rank` into both CTAs' stages (multicast), so L2 serves the tile once
// per pair; otherwise both boxes into this CTA's stage alone. Either way the whole B tile
// lands in each CTA's stage. Gated weights: box 0 the gate rows, box 1 the up rows.
template <bool kGatedWeights, class Ring>
__device__ __forceinline__ void produce_fp8_tile_pair(
    Ring& ring, int& it, int k_blocks, int tile, const CUtensorMap* a_map,
    const CUtensorMap* a_scales_map, const CUtensorMap* w_half_map, const Fp8Weights& w_scales,
    int row0, int n0, int expert, uint32_t rank, bool shared_b, uint64_t timeout_ns,
    int* report) {
  constexpr int kBoxRows = Ring::kTileN / 2, kBoxBytes = kBoxRows * kFp8BlockK;
  using Scales = WeightBlockScales<kGatedWeights, Ring::kTileN>;
  const Scales ws(w_scales, expert, k_blocks, n0);
  GroupScaleStream<Scales> scales(ws, k_blocks);
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    float g[Scales::kGroups];
    scales.next(kb, g);
    const int stage =
        start_fp8_stage(ring, it, kb, tile, a_map, a_scales_map, row0, g, timeout_ns, report);
    uint64_t* full = &ring.full[stage];
    const int k0 = kb * kFp8BlockK;
#pragma unroll
    for (int box = 0; box < 2; ++box) {
      const int c1 = kGatedWeights ? n0 : n0 + box * kBoxRows;
      const int c2 = kGatedWeights ? box : 0;
      if (!shared_b) {
        tma_load_4d(ring.b[stage] + box * kBoxBytes, w_half_map, full, k0, c1, c2, expert);
      } else if (box == static_cast<int>(rank)) {
        tma_load_4d_multicast(ring.b[stage] + box * kBoxBytes, w_half_map, full, k0, c1, c2,
                              expert, 0b11);
      }
    }
  }
}

// After its last tile a producer of a pair waits until both CTAs' consumers have released every
// stage: no arrive of the peer's is then still on its way into this CTA's barriers when it
// exits, and the peer has read every box this CTA multicast. The wide tiles' producer drains
// too: its consumers wait unbounded, so this bounded wait is what reports one that stalls.
template <class Ring>
__device__ __forceinline__ void drain_fp8_ring(Ring& ring, int it, uint64_t timeout_ns,
                                               int* report) {
  for (int i = it; i < it + Ring::kStageCount; ++i) {
    const int stage = i % Ring::kStageCount;
    mbar_wait(&ring.empty[stage], ((i / Ring::kStageCount) & 1) ^ 1, timeout_ns, kWaitProducer,
              -1, stage, report);
  }
}

// The descriptors' low words (k_major_sw128_low) of this warpgroup's 64 A rows and of the B
// tile in `stage`; a k32 step (32 bytes) adds 2 to each.
struct StageDescs {
  uint32_t a, b;
};

template <class Ring>
__device__ __forceinline__ StageDescs stage_descs(Ring& ring, int stage, int consumer) {
  return {k_major_sw128_low(ring.a[stage] + consumer * (kFp8ATileBytes / kGemmConsumers)),
          k_major_sw128_low(ring.b[stage])};
}

// This warpgroup's 64 rows of a stage times its whole B tile (kRegs / 2 weight rows) into
// fresh partial sums: four m64n128k32 (or m64n192k32) MMAs over the stage's 128 of K,
// committed and not waited for.
template <int kRegs>
__device__ __forceinline__ void issue_stage_mmas(StageDescs d, float (&partial)[kRegs]) {
  static_assert(kRegs == kFp8BlockN / 2 || kRegs == kFp8WideBlockN / 2, "128 or 192 columns");
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kFp8BlockK / 32; ++k) {
    if constexpr (kRegs == kFp8BlockN / 2) {
      wgmma_m64n128k32_e4m3(partial, k_major_sw128_desc(d.a + 2 * k),
                            k_major_sw128_desc(d.b + 2 * k), k > 0);
    } else {
      wgmma_m64n192k32_e4m3(partial, k_major_sw128_desc(d.a + 2 * k),
                            k_major_sw128_desc(d.b + 2 * k), k > 0);
    }
  }
  wgmma_commit();
}

// How a consumer waits for a stage's bytes: bounded (it reports a stall itself), or, on the
// wide tiles, unbounded - their producer's bounded waits for the stages' release (and its
// drain after the last tile) report any stall the consumer would wait in, and a consumer path
// without a trap keeps the registers setmaxnreg gives it.
template <class Ring>
__device__ __forceinline__ void wait_stage_full(uint64_t* full, uint32_t parity,
                                                uint64_t timeout_ns, int tile, int stage,
                                                int* report) {
  if constexpr (Ring::kTileN == kFp8BlockN) {
    mbar_wait(full, parity, timeout_ns, kWaitMma, tile, stage, report);
  } else {
    mbar_wait_unbounded(full, parity);
  }
}

// A consumer warpgroup with none of its rows in the tile releases each stage (pass_tile).
template <class Ring, class Release = LocalRelease>
__device__ __forceinline__ void pass_fp8_tile(Ring& ring, int& it, int k_blocks, int tile,
                                              bool leader, int barrier_id, uint64_t timeout_ns,
                                              int* report, const Release& release = Release{}) {
  if (leader) {
    for (int kb = 0; kb < k_blocks; ++kb) {
      const int stage = (it + kb) % Ring::kStageCount;
      wait_stage_full<Ring>(&ring.full[stage], ((it + kb) / Ring::kStageCount) & 1, timeout_ns,
                            tile, stage, report);
      release(&ring.empty[stage]);
    }
  }
  it += k_blocks;
  named_barrier_sync(barrier_id, 128);
}

// This thread's rows r, r + 8 of the tile, as an index into a stage's row-scale box.
__device__ __forceinline__ int row_scale_index(int tile_row0, int consumer) {
  const int t = threadIdx.x % 128;
  return tile_row0 % kFp8RowScaleAlign + consumer * kGemmWarpgroupRows + 16 * (t / 32) +
         (t % 32) / 4;
}

// acc += scale x partial, each 32-column group g (chunks 4g .. 4g + 3 of the fragment) of row
// i scaled by s[i][g]: one FFMA per accumulator. (A first block written as partial x scale
// instead made ptxas issue a predicated FMUL beside every FFMA, twice the promotion's
// instructions.)
template <int kRegs>
__device__ __forceinline__ void promote_block_scaled(float (&acc)[kRegs],
                                                     const float (&partial)[kRegs],
                                                     const float (&s)[2][kRegs / 16]) {
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int x = 4 * j + 2 * i + c;
        acc[x] = __fmaf_rn(partial[x], s[i][j / 4], acc[x]);
      }
    }
  }
}

// The E8M0 codes of this thread's rows r, r + 8 in a stage's row-scale box, read before the
// stage's MMAs are issued (as DeepGEMM's loop reads its scales). An unrolled loop that read
// them after the issue and probed the next stage during the MMAs gave wrong bits at the
// benchmark's size, cause not established (docs/perf-log.md, the consumer ladder).
template <class Ring>
__device__ __forceinline__ void row_scale_codes(const Ring& ring, int stage, int r,
                                                uint8_t (&codes)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) codes[i] = ld_shared_u8(ring.a_scales[stage] + r + 8 * i);
}

// The scales of a k-block for this thread's rows r, r + 8 and the weight groups:
// s[i][g] = row scale x group g's weight scale (from the rows' codes a and the stage's group
// scales w).
template <int kGroups>
__device__ __forceinline__ void block_scales(const uint8_t (&a)[2], const float (&w)[kGroups],
                                             float (&s)[2][kGroups]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float a_scale = e8m0_factor(a[i]);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) s[i][g] = a_scale * w[g];
  }
}

// Blockwise consumer side of one tile (first row tile_row0): acc = sum over k-blocks of
// scale_a[row] * scale_w * (A_kb W_kb^T) for this warpgroup's 64 rows. The columns of chunks
// j < kFp8BlockN / 16 belong to the first half (a gated tile's gate rows), the rest to the
// second.
// The promotion of block kb waits for its MMAs, and the MMAs of kb + 1 reuse its partial sums,
// so what lies between one block's MMAs and the next's is this warpgroup's critical path (the
// other consumer's MMAs fill the tensor cores meanwhile): the promotion's FFMAs, the next
// stage's wait, its rows' scale codes and the next MMAs' descriptors. kb's scales (the rows'
// codes decoded, times the stage's weight group scales) are made while kb's MMAs run.
// The k-loop is unrolled over the ring's stages, so each copy's stage is a constant: its
// barriers' and tiles' shared-memory addresses, and so the MMAs' descriptors, are fixed
// offsets from the ring's base (uniform registers) rather than arithmetic on a stage index
// held per thread: 1.20x a minimal consumer's rate in the ladder probe
// (benchmarks/probes/fp8_consumer_ladder.cu), this consumer 1.16x its indexed form
// (docs/perf-log.md, Blockwise FP8, the consumer ladder).
// A tile starts at any stage (`it`): the first turn skips the copies before it, the last stops
// after k_blocks.
// `partial` holds the MMAs' fresh sums of a block; a caller whose other tiles' accumulators
// stay live (the backward megakernel's BF16 n256 tiles) lends their registers for it.
// The tile is as wide as the ring's B tiles (Ring::kTileN: 128, or the grouped GEMM's wide
// tiles).
template <class Ring, class Release = LocalRelease>
__device__ __forceinline__ void consume_fp8_tile(
    Ring& ring, int& it, int k_blocks, int tile, int consumer, bool leader, int tile_row0,
    float (&acc)[Ring::kTileN / 2], float (&partial)[Ring::kTileN / 2], uint64_t timeout_ns,
    int* report, const Release& release = Release{}) {
  constexpr int kStages = Ring::kStageCount, kGroups = Ring::kTileN / kWeightGroupRows;
  const int r = row_scale_index(tile_row0, consumer);
#pragma unroll
  for (int x = 0; x < Ring::kTileN / 2; ++x) acc[x] = 0.f;
  uint32_t phase = (it / kStages) & 1;
  int first = it % kStages;  // the first turn's first stage
  int kb = 0;
  while (true) {
#pragma unroll
    for (int stage = 0; stage < kStages; ++stage) {
      if (stage >= first && kb < k_blocks) {
        wait_stage_full<Ring>(&ring.full[stage], phase, timeout_ns, tile, stage, report);
        uint8_t a_codes[2];
        row_scale_codes(ring, stage, r, a_codes);
        float w_group[kGroups];
        load_group_scales(ring.group_scales(stage), w_group);
        issue_stage_mmas(stage_descs(ring, stage, consumer), partial);
        float s[2][kGroups];
        block_scales(a_codes, w_group, s);
        wgmma_wait<0>();
        fence_accumulators(partial);
        if (leader) release(&ring.empty[stage]);
        promote_block_scaled(acc, partial, s);
        ++kb;
      }
    }
    if (kb >= k_blocks) break;
    first = 0;
    phase ^= 1;
  }
  it += k_blocks;
}

template <class Ring, class Release = LocalRelease>
__device__ __forceinline__ void consume_fp8_tile(Ring& ring, int& it, int k_blocks, int tile,
                                                 int consumer, bool leader, int tile_row0,
                                                 float (&acc)[Ring::kTileN / 2],
                                                 uint64_t timeout_ns, int* report,
                                                 const Release& release = Release{}) {
  float partial[Ring::kTileN / 2];
  consume_fp8_tile(ring, it, k_blocks, tile, consumer, leader, tile_row0, acc, partial,
                   timeout_ns, report, release);
}

}  // namespace mok::sm90
