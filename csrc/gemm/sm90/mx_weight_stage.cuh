// Block-scaled FP8 weights as the tile engine's B operand (grouped_gemm.cu given weight
// scales). A stage's weight tile arrives by TMA as E4M3 codes - kGemmBlockN rows of
// kGemmBlockK bytes, unswizzled - in the upper half of the stage's bf16 B buffer, and its E8M0
// scale codes beside it (MxStages); the producer warpgroup's warps 1.. (the converter: idle
// in the bf16 engine) dequantize the tile in place into the 128-byte-swizzled bf16 tile wgmma
// reads, then mark the stage full. The consumers run as with bf16 weights. The values are the
// ones quant/mx_round.cu writes (quant/mx_format.cuh), so the MMAs multiply MXFP8's values
// with fp32 accumulation while HBM moves one byte per weight.
//
//   TMA (A, codes, scales) -> loaded[stage] -> converter -> ring.full[stage] -> consumers
//
// Scales are laid out for TMA: [E, blocks along K, halves, N / halves padded to 16], so a
// stage's are kMxScaleRows rows of contiguous bytes per half. kScaleBlock: K elements per
// scale (32 for MXFP8; a 1x128 / 128x128 blockwise recipe's 128 fits the same stage).
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
constexpr int kMxChunksPerRow = kGemmBlockK / 16;  // a converter thread takes 16 codes
constexpr int kMxChunks = kGemmBlockN * kMxChunksPerRow;
constexpr int kMxConverterThreads = 96;  // warps 1-3 of the producer warpgroup
// The converter meets three times per stage (the tile's upper bf16 rows lie over the codes):
// after the lower rows (over no codes) and their codes are done, after the codes under the
// upper rows' second half are read, and after every row is written.
constexpr int kMxConvertBarrier = kStagingBarrier + kGemmConsumers;
static_assert(kMxCodeOffset == kBTileBytes / 2 && kGemmBlockK * 2 == 128 &&
                  kGemmBlockN % 4 == 0,
              "codes fill the upper half of the bf16 tile; a bf16 row is one swizzle row");

// Scale-code rows one stage needs: a k-block spans kGemmBlockK / kScaleBlock blocks, or lies
// inside one.
template <int kScaleBlock>
constexpr int mx_scale_rows() {
  return kGemmBlockK >= kScaleBlock ? kGemmBlockK / kScaleBlock : 1;
}
constexpr int kMxScaleStageBytes = kGemmBlockN * mx_scale_rows<kMxBlock>();

// A stage's scale codes ([half][scale row][row of the half], 128-aligned for TMA) and the
// barriers its loads complete on.
struct MxStages {
  alignas(128) uint8_t scales[kGemmStages][kMxScaleStageBytes];
  uint64_t loaded[kGemmStages];
};

__device__ __forceinline__ void init_mx_stages(MxStages& mx) {
  for (int i = 0; i < kGemmStages; ++i) mbar_init(&mx.loaded[i], 1);
  fence_barrier_init();
}

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

// The converter's work on one stage: 16-code chunk q (row q / kMxChunksPerRow) of the tile is
// converted by thread q % kMxConverterThreads.
template <bool kGatedWeights, int kScaleBlock = kMxBlock>
struct MxStageConverter {
  static_assert(kScaleBlock % 16 == 0, "16 consecutive codes share one scale");
  static constexpr int kHalfRows = kGatedWeights ? kGemmBlockN / 2 : kGemmBlockN;
  static constexpr int kScaleRows = mx_scale_rows<kScaleBlock>();
  static constexpr int kLower = kMxChunks / 2;      // bf16 rows over no codes
  static constexpr int kUpperB = kMxChunks * 3 / 4; // rows whose codes lie under other rows
  static constexpr int kHeld = (kMxChunks / 4 + kMxConverterThreads - 1) / kMxConverterThreads;

  int t;

  __device__ float factor(const uint8_t* scales, int q) const {
    const int j = q / kMxChunksPerRow;
    const int scale_row =
        kGemmBlockK >= kScaleBlock ? 16 * (q % kMxChunksPerRow) / kScaleBlock : 0;
    return e8m0_factor(scales[(j / kHalfRows) * kHalfRows * kScaleRows +
                              scale_row * kHalfRows + j % kHalfRows]);
  }
  __device__ static const int4& codes(const uint8_t* b, int q) {
    return *reinterpret_cast<const int4*>(b + kMxCodeOffset + 16 * q);
  }
  __device__ void store(uint8_t* b, const uint8_t* scales, int q, const int4& c) const {
    const int row = q / kMxChunksPerRow;
    store_dequantized(b + row * 128, row, 2 * (q % kMxChunksPerRow), c, factor(scales, q));
  }

  // Codes of a stage in b (its upper half), scale codes in `scales` -> the bf16 tile.
  __device__ void convert(uint8_t* b, const uint8_t* scales) const {
    // bf16 rows [0, N/2) lie over no codes; rows [N/2, 3N/4) over the codes of rows [0, N/2).
    for (int q = t; q < kLower; q += kMxConverterThreads) store(b, scales, q, codes(b, q));
    named_barrier_sync(kMxConvertBarrier, kMxConverterThreads);
    int4 held[kHeld];
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int q = kUpperB + t + i * kMxConverterThreads;
      if (q < kMxChunks) held[i] = codes(b, q);
    }
    for (int q = kLower + t; q < kUpperB; q += kMxConverterThreads) {
      store(b, scales, q, codes(b, q));
    }
    named_barrier_sync(kMxConvertBarrier, kMxConverterThreads);
    // Rows [3N/4, N) lie over the codes of rows [N/2, N), all read now.
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int q = kUpperB + t + i * kMxConverterThreads;
      if (q < kMxChunks) store(b, scales, q, held[i]);
    }
    fence_proxy_async_shared();  // the generic-proxy writes, before wgmma reads them
    named_barrier_sync(kMxConvertBarrier, kMxConverterThreads);
  }
};

// The converter's loop: the stages in the producer's order (k_blocks per tile, the block's
// tiles), each converted once loaded and handed to the consumers as full.
template <bool kGatedWeights>
__device__ __forceinline__ void convert_stages(StageRing& ring, MxStages& mx, int num_tiles,
                                               int k_blocks, int thread, uint64_t timeout_ns,
                                               int* report) {
  const MxStageConverter<kGatedWeights> converter{thread};
  int it = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const int stage = it % kGemmStages;
      mbar_wait(&mx.loaded[stage], (it / kGemmStages) & 1, timeout_ns, kWaitMxCodes, tile, stage,
                report);
      converter.convert(ring.b[stage], mx.scales[stage]);
      if (thread == 0) mbar_arrive(&ring.full[stage]);
    }
  }
}

}  // namespace mok::sm90
