// The FP8 engine's consumer for weight gradients under the blockwise recipe
// (Fp8SegmentScales, gemm/fp8_wgrad.cu): a stage is one 128-row block of an expert's rows,
// multiplied by four m64n128k32 E4M3 MMAs into fresh partial sums and promoted on the CUDA
// cores times the A row's scale and the B column's scale - two operations per accumulator per
// 128 of K (MXFP8's column consumer pays them per 32).
#pragma once

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/fp8_column_consumer.cuh"
#include "gemm/sm90/fp8_mainloop.cuh"
#include "gemm/sm90/tma.cuh"
#include "gemm/sm90/wgmma.cuh"

namespace mok::sm90 {

// acc = sum over the tile's k-blocks of scale_a[row] * scale_b[col] * (A_kb B_kb^T) for this
// warpgroup's 64 rows (tile_row0: the tile's first row, a multiple of 16). Each warp releases
// the stage once its promotion has read the stage's column scales (kReleasesPerConsumer).
__device__ __forceinline__ void consume_fp8_wgrad_tile(Fp8StageRing<Fp8SegmentScales>& ring,
                                                       int& it, int k_blocks, int tile,
                                                       int consumer, int tile_row0,
                                                       float (&acc)[kFp8AccRegs],
                                                       uint64_t timeout_ns, int* report) {
  constexpr int kHalf = kFp8AccRegs / 2;
  const int r = row_scale_index(tile_row0, consumer);
  const bool lane0 = threadIdx.x % 32 == 0;
  float partial[kFp8AccRegs];
#pragma unroll
  for (int x = 0; x < kFp8AccRegs; ++x) acc[x] = 0.f;
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kFp8Stages;
    mbar_wait(&ring.full[stage], (it / kFp8Stages) & 1, timeout_ns, kWaitMma, tile, stage,
              report);
    issue_stage_mmas(ring, stage, consumer, partial);
    // The stage's scales, loaded while the MMAs run.
    float a_scale[2];
    load_row_scales(ring, stage, 0, r, a_scale);
    uint4 pieces[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4* src = column_scale_pieces<false, 1>(ring.b_scales[stage], 0, h);
      pieces[h][0] = ld_shared_16(src);
      pieces[h][1] = ld_shared_16(src + 1);
    }
    wgmma_wait<0>();
    fence_accumulators(partial);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      promote_column_half(acc, *reinterpret_cast<const float(*)[kHalf]>(partial + h * kHalf),
                          a_scale, pieces[h], h);
    }
    if (lane0) mbar_arrive(&ring.empty[stage]);
  }
}

}  // namespace mok::sm90
