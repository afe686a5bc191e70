// The FP8 tile engine's stage ring and k-loops (gemm/fp8_grouped_gemm.cu): E4M3 operands with
// power-of-two scales, one per 1 x kScaleK of an activation row, and for the weights either one
// per 128 x 128 block (Fp8BlockScales: the blockwise recipe) or one per kScaleK x 1 of a weight
// row (Fp8ColumnScales: MXFP8, kScaleK = 32).
//
// A stage is 128 codes of K: the A tile (kGemmBlockM rows), the B tile (kFp8BlockN weight
// rows), both 128-byte swizzled by TMA, the A rows' scale codes of the stage's scale blocks and,
// for column scales, the weight columns' scales. A consumer warpgroup multiplies its 64 rows
// one scale block at a time (k32 wgmmas into fresh partial sums) and adds the partial sums to
// its fp32 accumulators times (row scale x weight scale) on the CUDA cores: the tensor cores'
// own accumulation never spans more than one scale block, and the promotion of one warpgroup
// overlaps the other's MMAs.
#pragma once

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tma.cuh"
#include "gemm/sm90/wgmma.cuh"
#include "quant/mx_format.cuh"

namespace mok::sm90 {

// The blockwise recipe: 1 x 128 row scales, one scale per 128 x 128 weight block (read from
// global memory, [E, ceil(N / 128), ceil(K / 128)] E8M0).
struct Fp8BlockScales {
  static constexpr int kScaleK = kFp8ScaleBlock;
  static constexpr bool kColumnScales = false;
};

// MXFP8: 1 x 32 row scales, one scale per 32 x 1 of each weight row (a column of the tile),
// loaded with the stage as bf16 powers of two in fragment order (column_scale_layout below).
struct Fp8ColumnScales {
  static constexpr int kScaleK = kMxBlock;
  static constexpr bool kColumnScales = true;
};

constexpr int kFp8ATileBytes = kGemmBlockM * kFp8BlockK;  // one byte per code
constexpr int kFp8BTileBytes = kFp8BlockN * kFp8BlockK;
constexpr int kFp8AccRegs = kFp8BlockN / 2;  // m64 x n128 fp32 over 128 threads
static_assert(kFp8BlockK == 128, "a stage's rows are one 128-byte swizzle row of codes");

// Column scales in fragment order: the scales of one tile's kFp8BlockN / halves weight rows
// (per half) and one k32 block are stored so that accumulator-fragment thread q (= lane % 4),
// whose columns are 8 j + 2 q + {0, 1}, finds its pairs side by side: column c of a group of
// kGroup at q (kGroup / 4) + 2 (c / 8) + c % 2 with q = (c % 8) / 2. Global memory holds
// [E, ceil(K / 32), halves, N / halves rounded up to kGroup] bf16; a stage holds
// [halves][kScaleBlocks][kGroup].
template <bool kGated>
struct ColumnScaleLayout {
  static constexpr int kHalves = kGated ? 2 : 1;
  static constexpr int kGroup = kFp8BlockN / kHalves;
};

template <class Scales>
struct Fp8StageRing {
  static constexpr int kScaleBlocks = kFp8BlockK / Scales::kScaleK;  // per stage
  static constexpr int kRowScaleBytes = kFp8RowScaleBox * kScaleBlocks;
  static constexpr int kColumnScaleElems = Scales::kColumnScales ? kScaleBlocks * kFp8BlockN : 8;
  // Who releases a stage, per consumer warpgroup: its leader after the MMAs (block scales are
  // used before the MMAs are issued), or each warp once its promotion has used the stage's
  // column scales (so no shared-memory read of them is still in flight at the release).
  static constexpr int kReleasesPerConsumer = Scales::kColumnScales ? 4 : 1;
  static constexpr uint32_t kTxBytes =
      kFp8ATileBytes + kFp8BTileBytes + kRowScaleBytes +
      (Scales::kColumnScales ? kColumnScaleElems * 2 : 0);

  uint8_t a[kFp8Stages][kFp8ATileBytes];  // each 1024-aligned: the swizzle atom
  uint8_t b[kFp8Stages][kFp8BTileBytes];
  alignas(128) uint8_t a_scales[kFp8Stages][(kRowScaleBytes + 127) / 128 * 128];  // E8M0
  alignas(128) uint16_t b_scales[kFp8Stages][kColumnScaleElems];  // bf16 bits, column scales
  uint64_t full[kFp8Stages];
  uint64_t empty[kFp8Stages];
};

template <class Scales>
__device__ __forceinline__ void init_fp8_ring(Fp8StageRing<Scales>& ring) {
  for (int i = 0; i < kFp8Stages; ++i) {
    mbar_init(&ring.full[i], 1);
    mbar_init(&ring.empty[i], kGemmConsumers * Fp8StageRing<Scales>::kReleasesPerConsumer);
  }
  fence_barrier_init();
}

// 2^(code - 127) for an E8M0 code; NaN for the NaN code (a block with a NaN or an Inf).
__device__ __forceinline__ float e8m0_value(uint8_t code) {
  return code == kE8m0Nan ? __uint_as_float(0x7FC00000u) : exact_exp2(int(code) - kE8m0Bias);
}

// Producer side of one tile (tile_engine.cuh: produce_tile, over the FP8 ring): A codes at
// (k0, row0), the A rows' scale codes of the stage's blocks, the weight rows' codes of expert
// e and, for column scales, their scales (w_scales_map: [E][blocks][halves][rows]).
template <class Scales, bool kGatedWeights>
__device__ __forceinline__ void produce_fp8_tile(Fp8StageRing<Scales>& ring, int& it,
                                                 int k_blocks, int tile,
                                                 const CUtensorMap* a_map,
                                                 const CUtensorMap* a_scales_map,
                                                 const CUtensorMap* w_map,
                                                 const CUtensorMap* w_scales_map, int row0,
                                                 int n0, int expert, uint64_t timeout_ns,
                                                 int* report) {
  using Ring = Fp8StageRing<Scales>;
  using Layout = ColumnScaleLayout<kGatedWeights>;
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kFp8Stages;
    mbar_wait(&ring.empty[stage], ((it / kFp8Stages) & 1) ^ 1, timeout_ns, kWaitProducer, tile,
              stage, report);
    uint64_t* full = &ring.full[stage];
    mbar_arrive_expect_tx(full, Ring::kTxBytes);
    const int k0 = kb * kFp8BlockK;
    tma_load_4d(ring.a[stage], a_map, full, k0, row0, 0, 0);
    tma_load_4d(ring.a_scales[stage], a_scales_map, full,
                row0 / kFp8RowScaleAlign * kFp8RowScaleAlign, kb * Ring::kScaleBlocks, 0, 0);
    tma_load_4d(ring.b[stage], w_map, full, k0, n0, 0, expert);
    if constexpr (kGatedWeights) {
      tma_load_4d(ring.b[stage] + kFp8BTileBytes / 2, w_map, full, k0, n0, 1, expert);
    }
    if constexpr (Scales::kColumnScales) {
#pragma unroll
      for (int h = 0; h < Layout::kHalves; ++h) {
        tma_load_4d(ring.b_scales[stage] + h * Ring::kScaleBlocks * Layout::kGroup, w_scales_map,
                    full, n0, h, kb * Ring::kScaleBlocks, expert);
      }
    }
  }
}

// A consumer warpgroup with none of its rows in the tile releases each stage (pass_tile).
template <class Scales>
__device__ __forceinline__ void pass_fp8_tile(Fp8StageRing<Scales>& ring, int& it, int k_blocks,
                                              int tile, bool leader, int barrier_id,
                                              uint64_t timeout_ns, int* report) {
  if (leader) {
    for (int kb = 0; kb < k_blocks; ++kb) {
      const int stage = (it + kb) % kFp8Stages;
      mbar_wait(&ring.full[stage], ((it + kb) / kFp8Stages) & 1, timeout_ns, kWaitMma, tile,
                stage, report);
      for (int i = 0; i < Fp8StageRing<Scales>::kReleasesPerConsumer; ++i) {
        mbar_arrive(&ring.empty[stage]);
      }
    }
  }
  it += k_blocks;
  named_barrier_sync(barrier_id, 128);
}

// The weight-block scales one consumer thread applies (blockwise): for every k-block, the
// E8M0 codes of the block holding the tile's first kFp8BlockN / halves rows of each half
// (w_scales [E, ceil(rows / 128), k_blocks], rows = halves x the half's rows).
template <bool kGatedWeights>
struct WeightBlockScales {
  const uint8_t* half0;
  const uint8_t* half1;

  __device__ WeightBlockScales(const uint8_t* w_scales, int expert, int row_blocks,
                               int k_blocks, int half_rows, int n0) {
    const uint8_t* e = w_scales + int64_t(expert) * row_blocks * k_blocks;
    half0 = e + (n0 / kFp8ScaleBlock) * k_blocks;
    half1 = kGatedWeights ? e + ((half_rows + n0) / kFp8ScaleBlock) * k_blocks : half0;
  }
};

// This thread's rows r, r + 8 of the tile, as an index into a stage's row-scale box.
__device__ __forceinline__ int row_scale_index(int tile_row0, int consumer) {
  const int t = threadIdx.x % 128;
  return tile_row0 % kFp8RowScaleAlign + consumer * kGemmWarpgroupRows + 16 * (t / 32) +
         (t % 32) / 4;
}

// acc (+)= scale x partial, chunk j of the fragment (8 columns) scaled by s[i][half of j].
__device__ __forceinline__ void promote_block_scaled(float (&acc)[kFp8AccRegs],
                                                     const float (&partial)[kFp8AccRegs],
                                                     const float (&s)[2][2], bool first) {
#pragma unroll
  for (int j = 0; j < kFp8AccRegs / 4; ++j) {
    const int h = j < kFp8AccRegs / 8 ? 0 : 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int x = 4 * j + 2 * i + c;
        acc[x] = first ? partial[x] * s[i][h] : __fmaf_rn(partial[x], s[i][h], acc[x]);
      }
    }
  }
}

// Blockwise consumer side of one tile (first row tile_row0): acc = sum over k-blocks of
// scale_a[row] * scale_w * (A_kb W_kb^T) for this warpgroup's 64 rows. The columns of chunks
// j < kFp8BlockN / 16 belong to the first half (a gated tile's gate rows), the rest to the
// second.
template <bool kGatedWeights>
__device__ __forceinline__ void consume_fp8_tile(Fp8StageRing<Fp8BlockScales>& ring, int& it,
                                                 int k_blocks, int tile, int consumer,
                                                 bool leader,
                                                 const WeightBlockScales<kGatedWeights>& ws,
                                                 int tile_row0, float (&acc)[kFp8AccRegs],
                                                 uint64_t timeout_ns, int* report) {
  const int r = row_scale_index(tile_row0, consumer);
  float partial[kFp8AccRegs];
  uint8_t w_next[2] = {__ldg(ws.half0), __ldg(ws.half1)};
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kFp8Stages;
    mbar_wait(&ring.full[stage], (it / kFp8Stages) & 1, timeout_ns, kWaitMma, tile, stage,
              report);
    // The scales are read (and used) before this warp issues its MMAs, so they are in
    // registers before the stage can be released and overwritten.
    const float w_scale[2] = {e8m0_value(w_next[0]), e8m0_value(w_next[1])};
    float s[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float a_scale = e8m0_value(ring.a_scales[stage][r + 8 * i]);
#pragma unroll
      for (int h = 0; h < 2; ++h) s[i][h] = a_scale * w_scale[h];
    }
    const uint64_t desc_a =
        smem_desc_k_major_sw128(ring.a[stage] + consumer * (kFp8ATileBytes / kGemmConsumers));
    const uint64_t desc_b = smem_desc_k_major_sw128(ring.b[stage]);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kFp8BlockK / 32; ++k) {
      wgmma_m64n128k32_e4m3(partial, desc_advance_k16(desc_a, k), desc_advance_k16(desc_b, k),
                            k > 0);
    }
    wgmma_commit();
    if (kb + 1 < k_blocks) {  // the next block's weight scales, while the MMAs run
      w_next[0] = __ldg(ws.half0 + kb + 1);
      w_next[1] = __ldg(ws.half1 + kb + 1);
    }
    wgmma_wait<0>();
    fence_accumulators(partial);
    if (leader) mbar_arrive(&ring.empty[stage]);
    promote_block_scaled(acc, partial, s, kb == 0);
  }
}

// The bf16 column scales of one half (kFp8BlockN / 2 columns: a gated tile's gate or up rows)
// of scale block `blk` that this thread applies (ColumnScaleLayout): 16-byte piece v (of 2)
// holds the pairs of the half's columns 8 j + 2 q and 8 j + 2 q + 1 for j = 4 v .. 4 v + 3.
template <bool kGatedWeights>
__device__ __forceinline__ const uint4* column_scale_pieces(const uint16_t* stage, int blk,
                                                            int half) {
  using Layout = ColumnScaleLayout<kGatedWeights>;
  constexpr int kBlocks = Fp8StageRing<Fp8ColumnScales>::kScaleBlocks;
  const int q = threadIdx.x % 4;
  return reinterpret_cast<const uint4*>(
      kGatedWeights ? stage + (half * kBlocks + blk) * Layout::kGroup + q * (Layout::kGroup / 4)
                    : stage + blk * Layout::kGroup + q * (Layout::kGroup / 4) +
                          half * (Layout::kGroup / 8));
}

// This thread's two row scales (rows r, r + 8) of scale block `blk` of `stage`.
__device__ __forceinline__ void load_row_scales(const Fp8StageRing<Fp8ColumnScales>& ring,
                                                int stage, int blk, int r, float (&a_scale)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    a_scale[i] = e8m0_value(ring.a_scales[stage][blk * kFp8RowScaleBox + r + 8 * i]);
  }
}

// acc's half `half` += row scale x column scale x partial (column scales: the two pieces of
// column_scale_pieces). partial x column scale is exact (a power of two), so each element is
// rounded once. A bf16 scale is the high half of its fp32.
__device__ __forceinline__ void promote_column_half(float (&acc)[kFp8AccRegs],
                                                    const float (&partial)[kFp8AccRegs / 2],
                                                    const float (&a_scale)[2],
                                                    const uint4 (&pieces)[2], int half) {
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    const uint32_t pairs[4] = {pieces[v].x, pieces[v].y, pieces[v].z, pieces[v].w};
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const float w_scale[2] = {__uint_as_float(pairs[jj] << 16),
                                __uint_as_float(pairs[jj] & 0xFFFF0000u)};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int x = 4 * (4 * v + jj) + 2 * i + c;
          float& a = acc[half * (kFp8AccRegs / 2) + x];
          a = __fmaf_rn(__fmul_rn(partial[x], w_scale[c]), a_scale[i], a);
        }
      }
    }
  }
}

// MXFP8 consumer side of one tile: acc = sum over 32-wide k-blocks of
// scale_a[row] * scale_w[col] * (A_blk W_blk^T). A step is one block times one half of the
// tile's columns (an m64n64k32 MMA into that half's partial sums); each step's MMA is issued
// before the previous step is promoted, so the tensor cores work while the CUDA cores promote.
// The step after the tile's last one repeats it (no branch around an MMA: ptxas would
// serialize them); its result is dropped. A stage is released by each warp
// (kReleasesPerConsumer) once its last step is promoted and no MMA reads it any more.
template <bool kGatedWeights>
__device__ __forceinline__ void consume_fp8_tile(Fp8StageRing<Fp8ColumnScales>& ring, int& it,
                                                 int k_blocks, int tile, int consumer,
                                                 int tile_row0, float (&acc)[kFp8AccRegs],
                                                 uint64_t timeout_ns, int* report) {
  constexpr int kBlocks = Fp8StageRing<Fp8ColumnScales>::kScaleBlocks;
  const int r = row_scale_index(tile_row0, consumer);
  const bool lane0 = threadIdx.x % 32 == 0;
  const int a_offset = consumer * (kFp8ATileBytes / kGemmConsumers);
  float partial[2][kFp8AccRegs / 2];
  float a_scale[2];
#pragma unroll
  for (int x = 0; x < kFp8AccRegs; ++x) acc[x] = 0.f;
  // Descriptors of stage 0; a stage's are these plus its offset (16-byte units).
  const uint64_t desc_a0 = smem_desc_k_major_sw128(ring.a[0] + a_offset);
  const uint64_t desc_b0 = smem_desc_k_major_sw128(ring.b[0]);
  constexpr uint64_t kStageA = kFp8ATileBytes >> 4, kStageB = kFp8BTileBytes >> 4;
  constexpr uint64_t kHalfB = kStageB / 2;
  int stage = it % kFp8Stages;
  mbar_wait(&ring.full[stage], (it / kFp8Stages) & 1, timeout_ns, kWaitMma, tile, stage, report);
  wgmma_fence();
  wgmma_m64n64k32_e4m3(partial[0], desc_a0 + stage * kStageA, desc_b0 + stage * kStageB, 0);
  wgmma_commit();
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    // The stage the step after this stage's last one reads: the next, or this one again.
    int next = stage;
    if (kb + 1 < k_blocks) {
      next = (it + 1) % kFp8Stages;
      mbar_wait(&ring.full[next], ((it + 1) / kFp8Stages) & 1, timeout_ns, kWaitMma, tile, next,
                report);
    }
#pragma unroll
    for (int step = 0; step < 2 * kBlocks; ++step) {
      const int blk = step / 2, h = step % 2;  // the step in flight; issue the one after it
      const bool last = step == 2 * kBlocks - 1;
      const int s = last ? next : stage;
      const int k32 = last ? 0 : (step + 1) / 2;
      wgmma_fence();
      wgmma_m64n64k32_e4m3(partial[1 - h], desc_advance_k16(desc_a0 + s * kStageA, k32),
                           desc_advance_k16(desc_b0 + s * kStageB, k32) + (h ? 0 : kHalfB), 0);
      wgmma_commit();
      // This step's scales, loaded while the MMAs run (a block's row scales serve both halves).
      if (h == 0) load_row_scales(ring, stage, blk, r, a_scale);
      const uint4* src = column_scale_pieces<kGatedWeights>(ring.b_scales[stage], blk, h);
      const uint4 pieces[2] = {ld_shared_16(src), ld_shared_16(src + 1)};
      wgmma_wait<1>();
      fence_accumulators(partial[h]);
      promote_column_half(acc, partial[h], a_scale, pieces, h);
    }
    // Every MMA reading this stage is done once the next stage's first step is; the last
    // stage is read by the repeated step until the wait below.
    if (next != stage && lane0) mbar_arrive(&ring.empty[stage]);
    stage = next;
  }
  wgmma_wait<0>();
  if (lane0) mbar_arrive(&ring.empty[stage]);
}

}  // namespace mok::sm90
