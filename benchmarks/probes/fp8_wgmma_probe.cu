// Probe for what bounds the blockwise FP8 engine (docs/perf-log.md, Blockwise FP8, 2026-12-05:
// its MMAs seemed to take about twice their peak time per stage; neither L2 - CTA pairs - nor
// the promotion gaps - the overlapped consumer - were it). Each of 132 CTAs holds kStages
// stages of a 128 x 128 E4M3 A tile and a 128 x 128 B tile in shared memory (filled once) and
// its two warpgroups run the engine's per-stage MMAs over them, without TMA:
//   mma        four m64n128k32 E4M3 wgmmas per stage, wgmma_wait<0> per stage, nothing else
//   mma+promo  the engine's consumer: fresh partial sums per stage, wait, 64 FFMA into acc
//   mma-n64x2  the overlapped consumer's shape: two m64n64 halves per stage, wait<1> between
//   mma-n256   four m64n256k32 per stage over a 256-row B (no promotion): half the MMA
//              instructions and 0.8x the operand bytes per flop of the n128 form
//   mma+writes `mma` while a third warpgroup's thread bulk-copies 32 KB per stage the MMAs
//              finish (the engine's TMA bytes, paced two stages ahead) from an L2-resident
//              buffer into shared memory: the MMAs' operand reads sharing shared memory with
//              the engine's writes, without the engine's barriers
// If `mma` reaches ~1400 TFLOP/s the engine loses its rate to its loads (TMA writes sharing
// shared memory with the MMAs' operand reads: `mma+writes` then drops toward ~740); if it sits
// near the engine's ~740, the wgmma form itself (SS operands, 4-MMA groups) is the cap and
// `mma-n256` says whether fewer, wider MMAs lift it.
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        -o /tmp/fp8_probe benchmarks/probes/fp8_wgmma_probe.cu && /tmp/fp8_probe
//
// Not part of the extension.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "gemm/sm90/tma.cuh"
#include "gemm/sm90/wgmma.cuh"
#include "probe_check.cuh"

using namespace mok::sm90;

// D[64x256] (+)= A[64x32] * B[256x32]^T, E4M3, both K-major: the probe's wide form (the engine
// has no use for it: with promotion its partial sums and accumulators would need 256 registers).
__device__ __forceinline__ void wgmma_m64n256k32_e4m3(float (&d)[128], uint64_t desc_a,
                                                      uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

constexpr int kStages = 5;
constexpr int kTileBytes = 128 * 128;  // 128 rows x 128 codes, 128-byte swizzled rows
constexpr int kCopyBytes = 16 * 1024;  // one bulk copy of mode kMmaWrites (two per stage)
constexpr int kSourceCopies = 8;       // the L2-resident source: 128 KB
enum Mode { kMma = 0, kMmaPromote = 1, kHalves = 2, kMmaN256 = 3, kMmaWrites = 4 };

struct Smem {
  uint8_t a[kStages][kTileBytes];
  uint8_t b[kStages][kTileBytes];
  uint8_t copies[2][kCopyBytes];  // kMmaWrites: where the bulk copies land
  uint64_t copied[2];
  volatile int stages_done;       // warpgroup 0's progress, for the copies' pace
};

// kMmaWrites: thread 256 keeps the copies two stages ahead of warpgroup 0 (two 16 KB copies
// per stage) until it has matched all `iters` stages, then drains its last copies.
__device__ void copy_writer(Smem& s, const uint8_t* src, int iters) {
  for (int q = 0; q < 2 * iters; ++q) {
    const int slot = q % 2;
    while (q >= 2 * (s.stages_done + 2)) {
    }
    if (q >= 2) {
      while (!mbar_try_wait(&s.copied[slot], ((q / 2) - 1) & 1)) {
      }
    }
    mbar_arrive_expect_tx(&s.copied[slot], kCopyBytes);
    bulk_load(s.copies[slot], src + (q % kSourceCopies) * kCopyBytes, kCopyBytes,
              &s.copied[slot]);
  }
  for (int q = 2 * iters - 2; q < 2 * iters; ++q) {
    while (!mbar_try_wait(&s.copied[q % 2], (q / 2) & 1)) {
    }
  }
}

// Mode kMmaN256: warpgroup wg's 64 rows times 256 B rows per stage.
__device__ void mma_n256(Smem& s, int wg, int iters, float* sink) {
  float wide[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) wide[i] = 0.f;
  for (int it = 0; it < iters; ++it) {
    // B: 256 consecutive rows of the b stages (two 128-row tiles back to back).
    const int stage = it % (kStages - 1);
    const uint64_t desc_a = smem_desc_k_major_sw128(s.a[stage] + wg * (kTileBytes / 2));
    const uint64_t desc_b = smem_desc_k_major_sw128(s.b[stage]);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wgmma_m64n256k32_e4m3(wide, desc_advance_k16(desc_a, k), desc_advance_k16(desc_b, k), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(wide);
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) sum += wide[i];
  if (sum == 12345.f) sink[threadIdx.x] = sum;
}

// The n128 modes: warpgroup wg's 64 rows times the 128-row B tile per stage.
template <int kMode>
__device__ void mma_n128(Smem& s, int wg, int iters, float* sink) {
  float acc[64], part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.f;
  float (&half0)[32] = *reinterpret_cast<float(*)[32]>(part);
  float (&half1)[32] = *reinterpret_cast<float(*)[32]>(part + 32);
  for (int it = 0; it < iters; ++it) {
    const int stage = it % kStages;
    const uint64_t desc_a = smem_desc_k_major_sw128(s.a[stage] + wg * (kTileBytes / 2));
    const uint64_t desc_b = smem_desc_k_major_sw128(s.b[stage]);
    const uint64_t desc_b1 = smem_desc_k_major_sw128(s.b[stage] + kTileBytes / 2);  // rows 64..127
    if constexpr (kMode == kHalves) {
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        wgmma_m64n64k32_e4m3(half0, desc_advance_k16(desc_a, k), desc_advance_k16(desc_b, k), k > 0);
      }
      wgmma_commit();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        wgmma_m64n64k32_e4m3(half1, desc_advance_k16(desc_a, k), desc_advance_k16(desc_b1, k),
                             k > 0);
      }
      wgmma_commit();
      wgmma_wait<1>();
      fence_accumulators(half0);
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[i] = __fmaf_rn(half0[i], 0.5f, acc[i]);
      wgmma_wait<0>();
      fence_accumulators(half1);
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[32 + i] = __fmaf_rn(half1[i], 0.5f, acc[32 + i]);
    } else {
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        wgmma_m64n128k32_e4m3(part, desc_advance_k16(desc_a, k), desc_advance_k16(desc_b, k),
                              kMode == kMma ? 1 : k > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(part);
      if constexpr (kMode == kMmaPromote) {
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = __fmaf_rn(part[i], 0.5f, acc[i]);
      }
      if (kMode == kMmaWrites && threadIdx.x == 0) s.stages_done = it + 1;
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) sum += acc[i] + part[i];
  if (sum == 12345.f) sink[threadIdx.x] = sum;  // keeps the loop
}

template <int kMode>
__global__ void __launch_bounds__(384, 1)
    fp8_probe_kernel(int iters, float* sink, const uint8_t* src) {
  extern __shared__ uint8_t raw[];
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  // Codes 0x38 (1.0) and 0x00: any finite values do for a rate.
  for (int i = threadIdx.x; i < kStages * kTileBytes / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(s.a)[i] = (i & 1) ? 0x38003800u : 0x00380038u;
    reinterpret_cast<uint32_t*>(s.b)[i] = (i & 2) ? 0x38003800u : 0x00380038u;
  }
  if (threadIdx.x == 0) {
    mbar_init(&s.copied[0], 1);
    mbar_init(&s.copied[1], 1);
    s.stages_done = 0;
    fence_barrier_init();
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 2) {
    if (kMode == kMmaWrites && threadIdx.x == 256) copy_writer(s, src, iters);
    return;
  }
  if constexpr (kMode == kMmaN256) mma_n256(s, wg, iters, sink);
  else mma_n128<kMode>(s, wg, iters, sink);
}

template <int kMode>
void run(int sms, int iters, int smem, float* sink, const uint8_t* src, cudaEvent_t t0,
         cudaEvent_t t1, const char* name) {
  CHECK(cudaFuncSetAttribute(fp8_probe_kernel<kMode>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  fp8_probe_kernel<kMode><<<sms, 384, smem>>>(iters, sink, src);
  CHECK(cudaEventRecord(t0));
  fp8_probe_kernel<kMode><<<sms, 384, smem>>>(iters, sink, src);
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  // Per CTA and stage: 2 warpgroups x 64 rows x (128 or 256) columns x 128 of K, 2 flops each.
  const double cols = kMode == kMmaN256 ? 256 : 128;
  const double flops = double(sms) * iters * 2.0 * 64 * cols * 128 * 2;
  printf("%-22s %8.1f TFLOP/s (%.3f ms, %.0f cycles per stage at 1.75 GHz)\n", name,
         flops / (ms * 1e-3) / 1e12, ms, ms * 1e-3 * 1.75e9 / iters);
}

int main() {
  const int sms = 132, iters = 1 << 14;
  const int smem = sizeof(Smem) + 1024;
  float* sink;
  uint8_t* src;
  CHECK(cudaMalloc(&sink, 1024 * sizeof(float)));
  CHECK(cudaMalloc(&src, kSourceCopies * kCopyBytes));
  CHECK(cudaMemset(src, 0x38, kSourceCopies * kCopyBytes));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  run<kMma>(sms, iters, smem, sink, src, t0, t1, "mma (wait<0>/stage)");
  run<kMmaPromote>(sms, iters, smem, sink, src, t0, t1, "mma + promotion");
  run<kHalves>(sms, iters, smem, sink, src, t0, t1, "two n64 halves");
  run<kMmaN256>(sms, iters, smem, sink, src, t0, t1, "mma n256");
  run<kMmaWrites>(sms, iters, smem, sink, src, t0, t1, "mma + 32 KB writes");
  return 0;
}
