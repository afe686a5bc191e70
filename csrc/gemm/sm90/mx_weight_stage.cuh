// Block-scaled FP8 weights as the tile engine's B operand (grouped_gemm.cu given weight
// scales). A stage's weight tile arrives by TMA as E4M3 codes - kGemmBlockN rows of
// kGemmBlockK bytes, unswizzled - in the upper half of the stage's bf16 B buffer, and its E8M0
// scale codes beside it (MxScaleRing); the consumer warpgroups' threads together dequantize
// the tile in place into the 128-byte-swizzled bf16 tile wgmma reads. The values are the ones
// quant/mx_round.cu writes (quant/mx_format.cuh), so the MMAs multiply MXFP8's values with
// fp32 accumulation while HBM moves one byte per weight.
//
// Scales are laid out for TMA: [E, blocks along K, halves, N / halves padded to 16], so a
// stage's are mx_scale_rows() rows of contiguous bytes per half. kScaleBlock: K elements per
// scale; the stage code takes it as a parameter (a 1x128 blockwise recipe's 128 included), the
// quantizers and the scales' tensor map use kMxBlock (32) today.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "common/vec.cuh"
#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "quant/mx_format.cuh"

namespace mok::sm90 {

constexpr int kMxCodeTileBytes = kGemmBlockN * kGemmBlockK;  // one byte per code
constexpr int kMxCodeOffset = kBTileBytes - kMxCodeTileBytes;
constexpr int kMxThreads = 128 * kGemmConsumers;
constexpr int kMxChunksPerRow = kGemmBlockK / 16;  // a thread converts 16 codes at a time
constexpr int kMxRowsPerPass = kMxThreads / kMxChunksPerRow;
constexpr int kMxPasses = kGemmBlockN / kMxRowsPerPass;
// All consumer threads meet twice per stage: every code read before a bf16 row overwrites
// it (the tile's upper bf16 rows lie over the codes; the lower ones are written first), and
// every row written before the MMAs read them.
constexpr int kMxStageBarrier = kStagingBarrier + kGemmConsumers;
static_assert(kMxCodeOffset >= 0 && kGemmBlockN % kMxRowsPerPass == 0 &&
                  kGemmBlockK * 2 == 128,
              "codes fit the bf16 tile; a bf16 row is one 128-byte swizzle row");

// Scale-code rows one stage needs: a k-block spans kGemmBlockK / kScaleBlock blocks, or lies
// inside one.
template <int kScaleBlock>
constexpr int mx_scale_rows() {
  return kGemmBlockK >= kScaleBlock ? kGemmBlockK / kScaleBlock : 1;
}
constexpr int kMxScaleStageBytes = kGemmBlockN * mx_scale_rows<kMxBlock>();

// A stage's scale codes: [half][scale row][row of the half], 128-aligned for TMA.
struct MxScaleRing {
  alignas(128) uint8_t codes[kGemmStages][kMxScaleStageBytes];
};

// The TMA loads of a stage's weight codes (expert_weight_codes_map) and scales
// (expert_weight_scales_map), the codes laid out as load_weight_tile lays out bf16 rows: a
// gated tile's gate rows, then its up rows.
template <bool kGatedWeights, int kScaleBlock = kMxBlock>
__device__ __forceinline__ void load_weight_codes(uint8_t* b, uint8_t* scales,
                                                  const CUtensorMap* codes_map,
                                                  const CUtensorMap* scales_map,
                                                  uint64_t* full, int k0, int n0, int expert) {
  constexpr int kHalves = kGatedWeights ? 2 : 1;
  constexpr int kHalfRows = kGemmBlockN / kHalves;
  const int scale_row = k0 / kScaleBlock;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    tma_load_4d(b + kMxCodeOffset + h * (kMxCodeTileBytes / kHalves), codes_map, full, k0, n0,
                h, expert);
    tma_load_4d(scales + h * kHalfRows * mx_scale_rows<kScaleBlock>(), scales_map, full, n0, h,
                scale_row, expert);
  }
}

constexpr uint32_t kMxStageTxBytes = kATileBytes + kMxCodeTileBytes + kMxScaleStageBytes;

// 16 codes (one 16-byte chunk) times 2^e as bf16 into the two 16-byte chunks q, q + 1 of a
// 128-byte-swizzled row (chunk q of row r sits at chunk q ^ (r % 8)).
__device__ __forceinline__ void store_dequantized(uint8_t* row_base, int row, int q,
                                                  const int4& codes, float factor) {
  const uint32_t* pairs = reinterpret_cast<const uint32_t*>(&codes);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint32_t o[4];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const uint32_t four = pairs[2 * half + w];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const auto two = static_cast<__nv_fp8x2_storage_t>(four >> (16 * h));
        const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3)));
        o[2 * w + h] = pack_bf16x2(__fmul_rn(f.x, factor), __fmul_rn(f.y, factor));
      }
    }
    *reinterpret_cast<int4*>(row_base + (((q + half) ^ (row % 8)) * 16)) =
        make_int4(o[0], o[1], o[2], o[3]);
  }
}

// One consumer thread's share of every stage: tile rows r0 + kMxRowsPerPass * p (p < kMxPasses),
// 16 codes from K offset 16 * chunk of each k-block. Everything it reads is in shared memory,
// so nothing waits on global memory between the stage filling and its MMAs.
template <bool kGatedWeights, int kScaleBlock = kMxBlock>
struct MxWeightStage {
  static_assert(kScaleBlock % 16 == 0, "16 consecutive codes share one scale");
  static constexpr int kHalfRows = kGatedWeights ? kGemmBlockN / 2 : kGemmBlockN;
  static constexpr int kScaleRows = mx_scale_rows<kScaleBlock>();
  // Passes whose bf16 rows lie below the codes: converted before the others are read.
  static constexpr int kLowPasses = kMxCodeOffset / 128 / kMxRowsPerPass;
  static_assert(kLowPasses >= 1 && kLowPasses < kMxPasses, "codes in the tile's upper rows");

  int r0, chunk;

  __device__ explicit MxWeightStage(int consumer_thread)
      : r0(consumer_thread / kMxChunksPerRow), chunk(consumer_thread % kMxChunksPerRow) {}

  __device__ float factor(const uint8_t* scales, int p) const {
    const int j = r0 + kMxRowsPerPass * p;
    const int scale_row = kGemmBlockK >= kScaleBlock ? 16 * chunk / kScaleBlock : 0;
    return e8m0_factor(scales[(j / kHalfRows) * kHalfRows * kScaleRows +
                              scale_row * kHalfRows + j % kHalfRows]);
  }

  // Dequantizes stage buffer b (codes at kMxCodeOffset, scale codes in `scales`) into the
  // bf16 tile. All kMxThreads threads call it per stage.
  __device__ void convert(uint8_t* b, const uint8_t* scales) const {
    const uint8_t* code_rows = b + kMxCodeOffset + 16 * chunk;
#pragma unroll
    for (int p = 0; p < kLowPasses; ++p) {
      const int row = r0 + kMxRowsPerPass * p;
      store_dequantized(b + row * 128, row, 2 * chunk,
                        *reinterpret_cast<const int4*>(code_rows + row * kGemmBlockK),
                        factor(scales, p));
    }
    int4 high[kMxPasses - kLowPasses];
#pragma unroll
    for (int p = kLowPasses; p < kMxPasses; ++p) {
      high[p - kLowPasses] = *reinterpret_cast<const int4*>(
          code_rows + (r0 + kMxRowsPerPass * p) * kGemmBlockK);
    }
    named_barrier_sync(kMxStageBarrier, kMxThreads);
#pragma unroll
    for (int p = kLowPasses; p < kMxPasses; ++p) {
      const int row = r0 + kMxRowsPerPass * p;
      store_dequantized(b + row * 128, row, 2 * chunk, high[p - kLowPasses], factor(scales, p));
    }
    fence_proxy_async_shared();  // the generic-proxy writes, before wgmma reads them
    named_barrier_sync(kMxStageBarrier, kMxThreads);
  }
};

// A consumer warpgroup with no rows in the tile still converts its share of every stage,
// then releases it (the other consumer's MMAs read the whole tile).
template <class Stage>
__device__ __forceinline__ void convert_only_tile(StageRing& ring, MxScaleRing& scales,
                                                  int& it, int k_blocks, int tile, bool leader,
                                                  const Stage& mx, uint64_t timeout_ns,
                                                  int* report) {
  for (int kb = 0; kb < k_blocks; ++kb, ++it) {
    const int stage = it % kGemmStages;
    mbar_wait(&ring.full[stage], (it / kGemmStages) & 1, timeout_ns, kWaitMma, tile, stage,
              report);
    mx.convert(ring.b[stage], scales.codes[stage]);
    if (leader) mbar_arrive(&ring.empty[stage]);
  }
}

}  // namespace mok::sm90
