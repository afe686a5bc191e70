// The FP8 engine's consumer under MXFP8 (Fp8ColumnScales, gemm/sm90/fp8_mainloop.cuh has the
// stage ring, the producer and the blockwise consumer): one 32-wide K block times one 64-column
// half per step, an m64n64k32 E4M3 MMA into that half's partial sums, promoted on the CUDA
// cores with the row's and the column's scales while the next step's MMA runs.
#pragma once

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/fp8_mainloop.cuh"
#include "gemm/sm90/tma.cuh"
#include "gemm/sm90/wgmma.cuh"

namespace mok::sm90 {

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
    a_scale[i] = e8m0_factor(ring.a_scales[stage][blk * kFp8RowScaleBox + r + 8 * i]);
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
