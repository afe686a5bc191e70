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

// Shared-space accesses by 32-bit address. The stage buffers are reached through a generic
// pointer into dynamic shared memory, which compiles to generic 64-bit loads and stores (LD.E /
// ST.E): slower than LDS / STS, and their 64-bit addresses cost the registers the consumer does
// not have (this file's SASS, 2026-12-03). Volatile: each stays on its side of the named
// barriers.
__device__ __forceinline__ uint4 lds_16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds_u8(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts_16(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                       uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c),
               "r"(d)
               : "memory");
}

// 16 codes (one 16-byte chunk) times 2^e as bf16 into two 16-byte chunks of a 128-byte-swizzled
// row: chunks q, q + 1 (q even) sit at q ^ (row % 8) and (q ^ (row % 8)) ^ 1, so `swizzled`
// (the first's byte offset) gives both. `row`: the row's shared-space address. (Placing each
// code's bits as a bf16 of value x 2^-120 and scaling with one bf16x2 multiply per pair issues
// a third of these instructions, none at the conversion units' quarter rate, and was no faster
// twice - 2026-12-03 and 2026-12-04, docs/perf-log.md MXFP8: the arithmetic does not bound this stage.)
__device__ __forceinline__ void store_dequantized(uint32_t row, int swizzled, const uint4& codes,
                                                  float factor) {
  const uint32_t* pairs = reinterpret_cast<const uint32_t*>(&codes);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint32_t o[4];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const uint32_t four = pairs[2 * half + w];
#pragma unroll
      for (int h = 0; h < 2; ++h) o[2 * w + h] = dequantize_pair(four >> (16 * h), factor);
    }
    sts_16(row + (swizzled ^ (16 * half)), o[0], o[1], o[2], o[3]);
  }
}

// One consumer thread's share of every stage: tile rows r0 + kMxRowsPerPass * p (p < kMxPasses),
// 16 codes from K offset 16 * chunk of each k-block. Everything it reads is in shared memory,
// so nothing waits on global memory between the stage filling and its MMAs.
//
// Registers: the consumer runs at the 168-register launch bound with 128 accumulators, and
// per-pass addresses and scale indices held across the k-loop were spilled and reloaded every
// stage (2026-12-03: ncu put 43% of the stall cycles on local-memory loads). So a thread derives
// four offsets per stage and every pass adds compile-time constants: r0 < kMxRowsPerPass, so pass p's
// row r0 + kMxRowsPerPass * p has r0's swizzle phase (row % 8) and lies in half
// kMxRowsPerPass * p / kHalfRows.
template <bool kGatedWeights, int kScaleBlock = kMxBlock>
struct MxWeightStage {
  static_assert(kScaleBlock % 16 == 0, "16 consecutive codes share one scale");
  static constexpr int kHalfRows = kGatedWeights ? kGemmBlockN / 2 : kGemmBlockN;
  static constexpr int kScaleRows = mx_scale_rows<kScaleBlock>();
  // Passes whose bf16 rows lie below the codes: converted before the others are read.
  static constexpr int kLowPasses = kMxCodeOffset / 128 / kMxRowsPerPass;
  static_assert(kLowPasses >= 1 && kLowPasses < kMxPasses, "codes in the tile's upper rows");
  static_assert(kHalfRows % kMxRowsPerPass == 0, "a pass's rows lie in one half");

  // The thread's offsets, recomputed from %tid.x at every stage: a volatile read the compiler
  // cannot hoist, so they cost a few integer operations per stage instead of registers held
  // across the k-loop (held, two of them were spilled and reloaded every k-block).
  struct Offsets {
    int code;     // this thread's 16 codes in its first row (from the stage's codes)
    int row;      // its first bf16 row in the stage's tile
    int swizzle;  // byte offset of its first 16-byte chunk within a row
    int scale;    // its first row's scale code (half 0, this thread's scale row)
  };

  __device__ static Offsets offsets() {
    uint32_t tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    const int t = static_cast<int>(tid) - 128;  // consumer threads follow the producer warpgroup
    const int r0 = t / kMxChunksPerRow, chunk = t % kMxChunksPerRow;
    const int scale_row = kGemmBlockK >= kScaleBlock ? 16 * chunk / kScaleBlock : 0;
    return {r0 * kGemmBlockK + 16 * chunk, r0 * 128, ((2 * chunk) ^ (r0 % 8)) * 16,
            scale_row * kHalfRows + r0};
  }

  // Pass p's scale code (p is a compile-time constant once the passes are unrolled);
  // `scales`: this thread's first scale code's shared-space address.
  __device__ static uint32_t scale_code(uint32_t scales, int p) {
    const int rows = kMxRowsPerPass * p;
    return lds_u8(scales + (rows / kHalfRows) * kHalfRows * kScaleRows + rows % kHalfRows);
  }

  // Dequantizes stage buffer b (codes at kMxCodeOffset, scale codes in `scales`) into the
  // bf16 tile. All kMxThreads threads call it per stage. Every pass's codes and scale code are
  // loaded before the first pass converts: the shared accesses are volatile (they keep their
  // order), so a pass's loads issued after the stores before it waited out their whole
  // latency each pass - the engine's largest stall (ncu, docs/perf-log.md MXFP8, 2026-12-04).
  __device__ void convert(uint8_t* b, const uint8_t* scales) const {
    const Offsets o = offsets();
    const uint32_t tile = smem_addr(b);
    const uint32_t codes = tile + kMxCodeOffset + o.code;
    const uint32_t rows = tile + o.row;
    const uint32_t scale_codes = smem_addr(scales) + o.scale;
    const int swizzled = o.swizzle;
    constexpr int kPassCodeBytes = kMxRowsPerPass * kGemmBlockK;
    constexpr int kPassRowBytes = kMxRowsPerPass * 128;
    uint32_t scale[kMxPasses];
    uint4 chunk[kMxPasses];
#pragma unroll
    for (int p = 0; p < kMxPasses; ++p) {
      scale[p] = scale_code(scale_codes, p);
      chunk[p] = lds_16(codes + p * kPassCodeBytes);
    }
#pragma unroll
    for (int p = 0; p < kLowPasses; ++p) {
      store_dequantized(rows + p * kPassRowBytes, swizzled, chunk[p],
                        e8m0_factor(static_cast<uint8_t>(scale[p])));
    }
    named_barrier_sync(kMxStageBarrier, kMxThreads);
#pragma unroll
    for (int p = kLowPasses; p < kMxPasses; ++p) {
      store_dequantized(rows + p * kPassRowBytes, swizzled, chunk[p],
                        e8m0_factor(static_cast<uint8_t>(scale[p])));
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
