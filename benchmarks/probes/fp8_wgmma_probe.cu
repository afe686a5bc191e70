// Probe for what bounds the blockwise FP8 engine (perf-log session 25: its MMAs take about twice
// their peak time per stage; neither L2 - CTA pairs - nor the promotion gaps - the overlapped
// consumer - were it). Each of 132 CTAs holds kStages stages of a 128 x 128 E4M3 A tile and a
// 128 x 128 B tile in shared memory (filled once) and its two warpgroups run the engine's
// per-stage MMAs over them, without TMA:
//   mma        four m64n128k32 E4M3 wgmmas per stage, wgmma_wait<0> per stage, nothing else
//   mma+promo  the engine's consumer: fresh partial sums per stage, wait, 64 FFMA into acc
//   mma-n64x2  the overlapped consumer's shape: two m64n64 halves per stage, wait<1> between
// If `mma` reaches ~1400 TFLOP/s the engine loses its rate to its loads (TMA writes sharing
// shared memory with the MMAs' operand reads); if it sits near the engine's ~740, the wgmma
// form itself (SS operands, 4-MMA groups) is the cap and A from registers is the lever.
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        -o /tmp/fp8_probe benchmarks/probes/fp8_wgmma_probe.cu && /tmp/fp8_probe
//
// Not part of the extension.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "gemm/sm90/wgmma.cuh"
#include "probe_check.cuh"

using namespace mok::sm90;

constexpr int kStages = 5;
constexpr int kTileBytes = 128 * 128;  // 128 rows x 128 codes, 128-byte swizzled rows
enum Mode { kMma = 0, kMmaPromote = 1, kHalves = 2 };

struct Smem {
  uint8_t a[kStages][kTileBytes];
  uint8_t b[kStages][kTileBytes];
};

template <int kMode>
__global__ void __launch_bounds__(256, 1) fp8_probe_kernel(int iters, float* sink) {
  extern __shared__ uint8_t raw[];
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  // Codes 0x38 (1.0) and 0x00: any finite values do for a rate.
  for (int i = threadIdx.x; i < kStages * kTileBytes / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(s.a)[i] = (i & 1) ? 0x38003800u : 0x00380038u;
    reinterpret_cast<uint32_t*>(s.b)[i] = (i & 2) ? 0x38003800u : 0x00380038u;
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const int wg = threadIdx.x / 128;
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
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) sum += acc[i] + part[i];
  if (sum == 12345.f) sink[threadIdx.x] = sum;  // keeps the loop
}

int main() {
  const int sms = 132, iters = 1 << 14;
  const int smem = sizeof(Smem) + 1024;
  float* sink;
  CHECK(cudaMalloc(&sink, 1024 * sizeof(float)));
  CHECK(cudaFuncSetAttribute(fp8_probe_kernel<kMma>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(fp8_probe_kernel<kMmaPromote>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(fp8_probe_kernel<kHalves>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  const char* names[3] = {"mma (wait<0>/stage)", "mma + promotion", "two n64 halves"};
  for (int mode = 0; mode < 3; ++mode) {
    auto launch = [&] {
      if (mode == kMma) fp8_probe_kernel<kMma><<<sms, 256, smem>>>(iters, sink);
      if (mode == kMmaPromote) fp8_probe_kernel<kMmaPromote><<<sms, 256, smem>>>(iters, sink);
      if (mode == kHalves) fp8_probe_kernel<kHalves><<<sms, 256, smem>>>(iters, sink);
    };
    launch();
    CHECK(cudaEventRecord(t0));
    launch();
    CHECK(cudaEventRecord(t1));
    CHECK(cudaEventSynchronize(t1));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    // Per CTA and stage: 2 warpgroups x 64 rows x 128 columns x 128 of K, 2 flops each.
    const double flops = double(sms) * iters * 2.0 * 64 * 128 * 128 * 2;
    printf("%-22s %8.1f TFLOP/s (%.3f ms, %.0f cycles per stage at 1.75 GHz)\n", names[mode],
           flops / (ms * 1e-3) / 1e12, ms, ms * 1e-3 * 1.75e9 / iters);
  }
  return 0;
}
