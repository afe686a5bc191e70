// Probe for the MXFP8 codes engine's stage rate (docs/perf-log.md, MXFP8, 2026-12-04): on
// DeepSeek E=256 T=2048 (64 rows per expert) the codes FC1 takes 4.14 ms and our BF16 FC1
// 4.01 ms - the same k-blocks per second on half the bytes. Which part of the load path sets
// that rate? This kernel runs only the engine's ring - a TMA producer thread and a consumer
// that holds each stage as the engine's does - over FC1's weights and rows, without MMAs.
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        -o /tmp/stream_probe benchmarks/probes/weight_stream_probe.cu && /tmp/stream_probe
//
// Per variant: the weight tile's form (bf16 rows of 128 bytes, E4M3 codes rows of 64 bytes at
// the weight row's pitch, or codes stored tile-contiguous: one 8 KiB bulk copy per half), ring
// depth, stages the consumer holds (2: the engine's, which releases a stage after the next
// k-block's MMAs are issued; 1: a consumer that frees a codes stage once it has converted it),
// `hold`, clocks the consumer spends per stage (~0.35 us of one warpgroup's m64n256k64
// MMAs at 64 rows; 1400: two warpgroups' at 128 rows), and `prefetch`, how many k-blocks ahead
// the producer prefetches the weight tile into L2 (bytes in flight without shared memory). Prints ms, weight bytes per second and us per k-block per SM. Tiles as the
// engine's FC1: expert-major, 16 n-blocks of 2 x 128 weight rows (gate, up), 112 k-blocks.
// Not part of the extension.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "gemm/sm90/tma.cuh"
#include "probe_check.cuh"

using namespace mok::sm90;

constexpr int kExperts = 256, kN = 4096, kK = 7168, kRowsPerExpert = 64;
constexpr int kHalfRows = 128, kNBlocks = kN / 2 / kHalfRows, kKBlock = 64;
constexpr int kKBlocks = kK / kKBlock;
constexpr int kTiles = kExperts * kNBlocks;
constexpr int kATile = 128 * kKBlock * 2;
constexpr int kMaxStages = 6;

enum Form : int { kBf16 = 0, kCodes = 1, kCodesTiled = 2 };

struct Params {
  int form, stages, held, with_a;
  long long hold;
  int prefetch;  // k-blocks ahead whose weight tile the producer prefetches into L2 (0: none)
};

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// The weight tile a later load will read, into L2 only (no shared memory, no barrier).
__device__ __forceinline__ void tma_prefetch_2d(const CUtensorMap* map, int c0, int c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(map),
               "r"(c0), "r"(c1)
               : "memory");
}

__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

__global__ void __launch_bounds__(64, 1)
    stream_kernel(const __grid_constant__ CUtensorMap w_map,
                  const __grid_constant__ CUtensorMap a_map, const uint8_t* tiled, Params p,
                  unsigned long long* sink) {
  extern __shared__ uint8_t raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                             ~uintptr_t(1023));
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const int b_bytes = p.form == kBf16 ? 2 * kHalfRows * kKBlock * 2 : 2 * kHalfRows * kKBlock;
  const int stage_bytes = b_bytes + kATile;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    fence_barrier_init();
  }
  __syncthreads();
  const uint32_t tx = b_bytes + (p.with_a ? kATile : 0);
  if (threadIdx.x == 0) {  // producer
    int it = 0;
    for (int t = blockIdx.x; t < kTiles; t += gridDim.x) {
      const int e = t / kNBlocks, nb = t % kNBlocks;
      for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
        const int s = it % p.stages;
        wait(&empty[s], ((it / p.stages) & 1) ^ 1);
        mbar_arrive_expect_tx(&full[s], tx);
        uint8_t* b = base + s * stage_bytes;
        for (int h = 0; h < 2; ++h) {
          const int row = e * kN + h * (kN / 2) + nb * kHalfRows;
          if (p.form == kCodesTiled) {
            const size_t tile = (static_cast<size_t>(e * 2 + h) * kNBlocks + nb) * kKBlocks + kb;
            bulk_load(b + h * (b_bytes / 2), tiled + tile * (kHalfRows * kKBlock),
                      kHalfRows * kKBlock, &full[s]);
          } else {
            tma_load_2d(b + h * (b_bytes / 2), &w_map, &full[s],
                        kb * kKBlock, row);
          }
        }
        const int ahead = kb + p.prefetch;
        if (p.prefetch > 0 && ahead < kKBlocks) {
          for (int h = 0; h < 2; ++h) {
            const int row = e * kN + h * (kN / 2) + nb * kHalfRows;
            if (p.form == kCodesTiled) {
              const size_t tile =
                  (static_cast<size_t>(e * 2 + h) * kNBlocks + nb) * kKBlocks + ahead;
              asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                               tiled + tile * (kHalfRows * kKBlock)),
                           "r"(kHalfRows * kKBlock)
                           : "memory");
            } else {
              tma_prefetch_2d(&w_map, ahead * kKBlock, row);
            }
          }
        }
        if (p.with_a) tma_load_2d(b + b_bytes, &a_map, &full[s], kb * kKBlock, e * kRowsPerExpert);
      }
    }
  } else if (threadIdx.x == 32) {  // consumer
    int it = 0, prev = -1;
    unsigned long long acc = 0;
    for (int t = blockIdx.x; t < kTiles; t += gridDim.x) {
      for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
        const int s = it % p.stages;
        wait(&full[s], (it / p.stages) & 1);
        acc += base[s * stage_bytes + (kb % 64)];
        if (p.held == 1) mbar_arrive(&empty[s]);
        const long long start = clock64();
        while (clock64() - start < p.hold) {
        }
        if (p.held == 2) {
          if (prev >= 0) mbar_arrive(&empty[prev]);
          prev = s;
        }
      }
    }
    if (prev >= 0) mbar_arrive(&empty[prev]);
    sink[blockIdx.x] = acc;
  }
}

static PFN_cuTensorMapEncodeTiled_v12000 encode() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                         cudaEnableDefault, &q));
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// A row-major [rows, cols] tensor of `elem`-byte elements, boxes of box_cols x box_rows.
static CUtensorMap map_2d(void* ptr, CUtensorMapDataType type, int elem, uint64_t cols,
                          uint64_t rows, uint32_t box_cols, uint32_t box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * elem};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t estr[2] = {1, 1};
  CUresult r = encode()(&m, type, 2, ptr, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("tensor map failed %d\n", int(r));
    exit(1);
  }
  return m;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t w_bytes = static_cast<size_t>(kExperts) * kN * kK * 2;  // bf16; codes use half
  const size_t a_bytes = static_cast<size_t>(kExperts) * kRowsPerExpert * kK * 2 + (1 << 22);
  uint8_t *w, *a;
  unsigned long long* sink;
  CHECK(cudaMalloc(&w, w_bytes));
  CHECK(cudaMalloc(&a, a_bytes));
  CHECK(cudaMalloc(&sink, sms * sizeof(unsigned long long)));
  CHECK(cudaMemset(w, 0x11, w_bytes));
  CHECK(cudaMemset(a, 0x22, a_bytes));
  const uint64_t weight_rows = static_cast<uint64_t>(kExperts) * kN;
  const CUtensorMap bf16_map = map_2d(w, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kK, weight_rows,
                                      kKBlock, kHalfRows);
  const CUtensorMap codes_map = map_2d(w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, kK, weight_rows,
                                       kKBlock, kHalfRows);
  const CUtensorMap a_map = map_2d(a, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kK,
                                   static_cast<uint64_t>(kExperts) * kRowsPerExpert + 128,
                                   kKBlock, 128);
  CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             227 * 1024));
  // {form, stages, held, A, hold clocks, prefetch distance}
  const Params variants[] = {
      {kBf16, 3, 2, 1, 0, 0},         {kCodes, 3, 2, 1, 0, 0},      {kCodesTiled, 3, 2, 1, 0, 0},
      {kCodes, 6, 2, 1, 0, 0},        {kCodesTiled, 6, 2, 1, 0, 0}, {kCodes, 3, 1, 1, 0, 0},
      {kBf16, 3, 2, 0, 0, 0},         {kCodes, 3, 2, 0, 0, 0},      {kBf16, 3, 2, 1, 700, 0},
      {kCodes, 3, 2, 1, 700, 0},      {kCodesTiled, 3, 2, 1, 700, 0},
      {kCodes, 6, 2, 1, 700, 0},      {kCodesTiled, 6, 2, 1, 700, 0},
      {kCodes, 3, 1, 1, 700, 0},      {kCodes, 4, 1, 1, 700, 0},    {kCodesTiled, 4, 1, 1, 700, 0},
      {kCodes, 3, 2, 1, 700, 2},      {kCodes, 3, 2, 1, 700, 4},    {kCodes, 3, 2, 1, 700, 8},
      {kCodesTiled, 3, 2, 1, 700, 4}, {kBf16, 3, 2, 1, 700, 2},     {kBf16, 3, 2, 1, 700, 4},
      {kBf16, 3, 2, 1, 1400, 0},      {kBf16, 3, 2, 1, 1400, 4},    {kCodes, 3, 2, 1, 1400, 0},
      {kCodes, 3, 2, 1, 1400, 4},     {kBf16, 3, 2, 0, 700, 0},     {kCodes, 3, 2, 0, 700, 0},
      {kCodes, 6, 2, 0, 700, 0},      {kCodes, 3, 2, 0, 700, 4}};
  const char* forms[] = {"bf16 rows", "codes rows", "codes tiled"};
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  printf("E=%d N=%d K=%d, %d rows per expert, %d SMs, %d tiles x %d k-blocks\n", kExperts, kN,
         kK, kRowsPerExpert, sms, kTiles, kKBlocks);
  for (const Params& p : variants) {
    const int b_bytes = p.form == kBf16 ? 2 * kHalfRows * kKBlock * 2 : 2 * kHalfRows * kKBlock;
    const int smem = p.stages * (b_bytes + kATile) + 1024;
    if (smem > 227 * 1024) continue;
    const CUtensorMap& wm = p.form == kBf16 ? bf16_map : codes_map;
    float best = 1e30f;
    for (int rep = 0; rep < 4; ++rep) {
      CHECK(cudaEventRecord(t0));
      stream_kernel<<<sms, 64, smem>>>(wm, a_map, w, p, sink);
      CHECK(cudaEventRecord(t1));
      CHECK(cudaEventSynchronize(t1));
      CHECK(cudaGetLastError());
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, t0, t1));
      if (rep > 0 && ms < best) best = ms;
    }
    const double weight = static_cast<double>(kTiles) * kKBlocks * b_bytes;
    const double kblocks_per_sm = static_cast<double>(kTiles) * kKBlocks / sms;
    printf("%-12s stages %d held %d A %d hold %4lld clk prefetch %d | %7.3f ms  %6.2f TB/s "
           "weights  %5.3f us per k-block\n",
           forms[p.form], p.stages, p.held, p.with_a, p.hold, p.prefetch, best, weight / best / 1e9,
           best * 1e3 / kblocks_per_sm);
  }
  return 0;
}
