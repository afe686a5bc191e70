// Probe: how fast the blockwise FP8 engine's consumer runs over a real stage ring, against
// minimal consumers over the same ring (docs/perf-log.md, Blockwise FP8). fp8_wgmma_probe.cu
// measured the MMAs on resident stages (1950 TFLOP/s; 1778 with the promotion; 1360 with 32 KB
// of bulk writes per stage beside them), and the engine runs at 0.79-0.97x CUTLASS's grouped
// kernel. Here each of 132 CTAs runs `tiles` tiles of `k_blocks` k-blocks: one producer thread
// fills a ring of stages by bulk copies from an L2-resident source (no tensor maps, no HBM),
// two consumer warpgroups take 64 rows each, no epilogue. The rungs:
//   minimal        wait the stage (unbounded), four MMAs, wait, release, 64 FFMAs with one
//                  constant scale: the least a blockwise consumer does per k-block
//   minimal+scales minimal with DeepGEMM's scales: the stage's fp32 row scales from shared
//                  memory (copied with the stage) times the tile's fp32 weight scale per
//                  k-block (read into shared memory once per tile)
//   static         minimal+scales with the stage index a compile-time constant: the k-loop
//                  unrolled over the ring, a tile a whole number of ring turns
//   engine         the engine's consumer (fp8_mainloop.cuh: consume_fp8_tile) over its own
//                  ring (E8M0 row-scale codes in the stage, the weight groups' fp32 scales
//                  decoded into it by the producer from codes in global memory)
//   engine-n192    the same with the grouped GEMM's 192-column tiles (4 stages)
// If `engine` sits well below `minimal+scales`, the consumer's own code is what the engine
// loses; if all rungs sit together, the loss is outside the consumer (the producer's tensor
// maps, HBM, the epilogue, the tile walk).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        -o /tmp/fp8_ladder benchmarks/probes/fp8_consumer_ladder.cu && /tmp/fp8_ladder
//
// Not part of the extension.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "gemm/sm90/fp8_mainloop.cuh"
#include "probe_check.cuh"

using namespace mok;
using namespace mok::sm90;

enum Mode { kMinimal = 0, kMinimalScales = 1, kStatic = 2, kEngine = 3, kEngineN192 = 4 };

constexpr int kSourceChunks = 8;
constexpr int kChunkBytes = 24 * 1024;  // a source chunk holds one stage's A or B codes
constexpr uint64_t kTimeoutNs = 2000000000ull;
constexpr int kMinimalStages = 6;  // the minimal rungs' ring; the static rung's unroll

// The minimal rungs' ring: A and B codes and the A rows' fp32 scales per stage.
template <int kStages>
struct MinimalRing {
  static constexpr int kStageCount = kStages;
  static constexpr int kTileN = kFp8BlockN;
  uint8_t a[kStages][kFp8ATileBytes];
  uint8_t b[kStages][kFp8BTileBytes];
  float a_scales[kStages][kGemmBlockM];
  float w_scales[kGemmConsumers][64];  // one tile's, per consumer warpgroup
  uint64_t full[kStages];
  uint64_t empty[kStages];
  static constexpr uint32_t kTxBytes = kFp8ATileBytes + kFp8BTileBytes + kGemmBlockM * 4;
};

using Minimal = MinimalRing<kMinimalStages>;

template <int kMode>
struct RingOf {
  using T = Minimal;
};
template <>
struct RingOf<kEngine> {
  using T = Fp8StageRing<Fp8BlockScales, kFp8MaxStages, kFp8BlockN>;  // the grouped GEMM's at E = 8
};
template <>
struct RingOf<kEngineN192> {
  using T = Fp8StageRing<Fp8BlockScales, kFp8WideStages, kFp8WideBlockN>;
};

template <class Ring>
__device__ void produce(Ring& ring, const uint8_t* src, const uint8_t* w_codes, int tiles,
                        int k_blocks) {
  constexpr bool kEngineRing = !std::is_same_v<Ring, Minimal>;
  using Scales = WeightBlockScales<false, Ring::kTileN>;
  int it = 0;
  for (int tile = 0; tile < tiles; ++tile) {
    // The engine's producer's weight scales (two 128-row blocks of codes); unused by the
    // minimal rings.
    const Scales ws(Fp8Weights{w_codes, 2, Ring::kTileN}, 0, k_blocks, 0);
    GroupScaleStream<Scales> scales(ws, k_blocks);
    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const int stage = it % Ring::kStageCount;
      float g[Scales::kGroups];
      scales.next(kb, g);
      mbar_wait_unbounded(&ring.empty[stage], ((it / Ring::kStageCount) & 1) ^ 1);
      if constexpr (kEngineRing) store_group_scales(ring.group_scales(stage), g);
      uint64_t* full = &ring.full[stage];
      mbar_arrive_expect_tx(full, Ring::kTxBytes);
      const uint8_t* chunk = src + (it % kSourceChunks) * kChunkBytes;
      bulk_load(ring.a[stage], chunk, kFp8ATileBytes, full);
      if constexpr (kEngineRing) {
        bulk_load(ring.b[stage], chunk, Ring::kBTileBytes, full);
        bulk_load(ring.a_scales[stage], src + kSourceChunks * kChunkBytes + 512,
                  Ring::kRowScaleBytes, full);
      } else {
        bulk_load(ring.b[stage], chunk, kFp8BTileBytes, full);
        bulk_load(ring.a_scales[stage], src + kSourceChunks * kChunkBytes, kGemmBlockM * 4, full);
      }
    }
  }
  // Every stage released before the CTA exits.
  for (int i = it; i < it + Ring::kStageCount; ++i) {
    mbar_wait_unbounded(&ring.empty[i % Ring::kStageCount], ((i / Ring::kStageCount) & 1) ^ 1);
  }
}

// One k-block of the minimal rungs on `stage`: MMAs, wait, release, promotion by s0 (rows r)
// and s1 (rows r + 8).
__device__ __forceinline__ void minimal_block(Minimal& ring, int stage, int consumer,
                                              bool leader, float s0, float s1, float (&acc)[64],
                                              float (&partial)[64]) {
  const StageDescs d = stage_descs(ring, stage, consumer);
  issue_stage_mmas(d, partial);
  wgmma_wait<0>();
  fence_accumulators(partial);
  if (leader) mbar_arrive(&ring.empty[stage]);
#pragma unroll
  for (int x = 0; x < 64; ++x) acc[x] = __fmaf_rn(partial[x], (x & 2) ? s1 : s0, acc[x]);
}

// Every accumulator feeds the result (else the compiler drops their FFMAs): eight chains.
template <int kRegs>
__device__ __forceinline__ float fold(const float (&acc)[kRegs]) {
  float part[8] = {};
#pragma unroll
  for (int x = 0; x < kRegs; ++x) part[x % 8] += acc[x];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

template <int kMode>
__device__ void consume(typename RingOf<kMode>::T& ring, const float* w_scales_f32, int tiles,
                        int k_blocks, int consumer, float* sink, int* report) {
  constexpr int kTileN = kMode == kEngineN192 ? kFp8WideBlockN : kFp8BlockN;
  const bool leader = threadIdx.x % 128 == 0;
  const int t = threadIdx.x % 128;
  const int r = 16 * (t / 32) + (t % 32) / 4 + consumer * 64;
  float acc[kTileN / 2], partial[kTileN / 2];
  int it = 0;
  float check = 0.f;
  for (int tile = 0; tile < tiles; ++tile) {
    if constexpr (kMode == kEngine || kMode == kEngineN192) {
      consume_fp8_tile(ring, it, k_blocks, tile, consumer, leader, 0, acc, partial, kTimeoutNs,
                       report);
    } else {
#pragma unroll
      for (int x = 0; x < 64; ++x) acc[x] = 0.f;
      if constexpr (kMode != kMinimal) {
        float* ws = ring.w_scales[consumer];
        for (int i = t; i < k_blocks; i += 128) ws[i] = w_scales_f32[i];
        named_barrier_sync(1 + consumer, 128);
      }
      if constexpr (kMode == kStatic) {
        // it is a multiple of the ring's stages at every tile start (k_blocks is).
        for (int kb0 = 0; kb0 < k_blocks; kb0 += kMinimalStages) {
          const uint32_t phase = ((it + kb0) / kMinimalStages) & 1;
#pragma unroll
          for (int s = 0; s < kMinimalStages; ++s) {
            const float wsc = ring.w_scales[consumer][kb0 + s];
            mbar_wait_unbounded(&ring.full[s], phase);
            const float s0 = ring.a_scales[s][r] * wsc, s1 = ring.a_scales[s][r + 8] * wsc;
            minimal_block(ring, s, consumer, leader, s0, s1, acc, partial);
          }
        }
      } else {
        for (int kb = 0; kb < k_blocks; ++kb) {
          const int i = it + kb, stage = i % kMinimalStages;
          mbar_wait_unbounded(&ring.full[stage], (i / kMinimalStages) & 1);
          float s0 = 1.f, s1 = 1.f;
          if constexpr (kMode == kMinimalScales) {
            const float wsc = ring.w_scales[consumer][kb];
            s0 = ring.a_scales[stage][r] * wsc;
            s1 = ring.a_scales[stage][r + 8] * wsc;
          }
          minimal_block(ring, stage, consumer, leader, s0, s1, acc, partial);
        }
      }
      it += k_blocks;
      if constexpr (kMode != kMinimal) named_barrier_sync(1 + consumer, 128);  // w_scales reused
    }
    check += fold(acc);
  }
  if (check == 12345.f) sink[threadIdx.x] = check;  // keeps the work
}

template <int kMode>
__global__ void __launch_bounds__(kGemmThreads, 1)
    ladder_kernel(const uint8_t* src, const float* w_scales_f32, const uint8_t* w_codes,
                  int tiles, int k_blocks, float* sink, int* report) {
  using Ring = typename RingOf<kMode>::T;
  extern __shared__ uint8_t raw[];
  Ring& ring =
      *reinterpret_cast<Ring*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  if (threadIdx.x == 0) init_fp8_ring<1>(ring);
  __syncthreads();
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    warpgroup_reg_dealloc<kGemmProducerRegs>();
    if (threadIdx.x == 0) produce(ring, src, w_codes, tiles, k_blocks);
    return;
  }
  warpgroup_reg_alloc<kGemmConsumerRegs>();
  const int consumer = __shfl_sync(0xffffffffu, warpgroup - 1, 0);
  consume<kMode>(ring, w_scales_f32, tiles, k_blocks, consumer, sink, report);
}

template <int kMode>
void run(const char* name, int tiles, int k_blocks, const uint8_t* src, const float* wf,
         const uint8_t* wc, float* sink, int* report) {
  using Ring = typename RingOf<kMode>::T;
  const int smem = sizeof(Ring) + 1024, sms = 132;
  CHECK(cudaFuncSetAttribute(ladder_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  ladder_kernel<kMode><<<sms, kGemmThreads, smem>>>(src, wf, wc, tiles, k_blocks, sink, report);
  CHECK(cudaEventRecord(t0));
  const int reps = 5;
  for (int i = 0; i < reps; ++i) {
    ladder_kernel<kMode><<<sms, kGemmThreads, smem>>>(src, wf, wc, tiles, k_blocks, sink, report);
  }
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  ms /= reps;
  const int cols = kMode == kEngineN192 ? kFp8WideBlockN : kFp8BlockN;
  const double flops = double(sms) * tiles * k_blocks * 2.0 * kGemmBlockM * cols * kFp8BlockK;
  const double cycles = ms * 1e-3 * 1.755e9 / (double(tiles) * k_blocks);
  printf("%-15s K=%5d  %7.1f TFLOP/s  %6.1f cycles per k-block at 1.755 GHz\n", name,
         k_blocks * kFp8BlockK, flops / (ms * 1e-3) / 1e12, cycles);
}

int main() {
  uint8_t *src, *wc;
  float *wf, *sink;
  int* report;
  CHECK(cudaMalloc(&src, kSourceChunks * kChunkBytes + 1024));
  CHECK(cudaMalloc(&wc, 4096));
  CHECK(cudaMalloc(&wf, 4096));
  CHECK(cudaMalloc(&sink, 1024 * sizeof(float)));
  CHECK(cudaMalloc(&report, 64));
  // Codes 0x38 (1.0); after the chunks the minimal rungs' fp32 row scales (1.0), then the
  // engine's E8M0 row-scale codes (127: 1.0).
  CHECK(cudaMemset(src, 0x38, kSourceChunks * kChunkBytes));
  float host[256];
  for (float& v : host) v = 1.f;
  CHECK(cudaMemcpy(src + kSourceChunks * kChunkBytes, host, 512, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(src + kSourceChunks * kChunkBytes + 512, 127, 512));
  CHECK(cudaMemcpy(wf, host, 1024, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(wc, 127, 4096));
  for (int k_blocks : {48, 6}) {
    const int tiles = k_blocks == 48 ? 32 : 256;
    run<kMinimal>("minimal", tiles, k_blocks, src, wf, wc, sink, report);
    run<kMinimalScales>("minimal+scales", tiles, k_blocks, src, wf, wc, sink, report);
    run<kStatic>("static", tiles, k_blocks, src, wf, wc, sink, report);
    run<kEngine>("engine", tiles, k_blocks, src, wf, wc, sink, report);
    run<kEngineN192>("engine-n192", tiles, k_blocks, src, wf, wc, sink, report);
  }
  return 0;
}
