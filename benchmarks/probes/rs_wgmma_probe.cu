// Probe for the MXFP8 engine design in docs/mxfp8.md ("A third engine, designed and probed, not
// built"; its ceiling is the BF16 rate): does a bf16 wgmma with its A operand in registers,
// converted each k-step from E4M3 codes in shared memory (times the block's power-of-two
// scale), run near the rate of the plain shared-memory form, and is the conversion exact
// (subnormal codes included)?
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        -o /tmp/rs_probe benchmarks/probes/rs_wgmma_probe.cu && /tmp/rs_probe
//
// Prints: (1) the exactness check - one 64 x 128 x 64 tile with codes over all finite E4M3
// values and scales 2^-20 .. 2^7, D against the host's exact products; (2) TFLOP/s of 132 CTAs x
// 2 warpgroups looping over shared-memory-resident tiles: SS (both operands in shared memory),
// RS (A from registers, no conversion), RS + conversion (codes loaded and converted for the
// next k-step while the current MMAs run). Not part of the extension.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gemm/sm90/wgmma.cuh"
#include "probe_check.cuh"

using namespace mok::sm90;

constexpr int kRows = 128;     // weight rows of a CTA tile (two warpgroups x m64)
constexpr int kTokens = 128;   // n
constexpr int kK = 64;         // K per stage
constexpr int kStages = 4;
constexpr int kBBytes = kTokens * kK * 2;  // bf16, 128-byte swizzled rows
constexpr int kACodeBytes = kRows * kK;    // E4M3 codes, fragment-permuted rows
constexpr int kABf16Bytes = kRows * kK * 2;

// Two E4M3 codes (bytes sel of w) as a bf16 pair, exactly value x 2^-120: sign to bit 15,
// exponent and mantissa bits to bits 4..10 of each half (E4M3's subnormal step lines up with
// bf16's). Then one bf16x2 multiply by 2^(120 + e) applies the scale exactly.
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t codes_to_bf16x2(uint32_t w, __nv_bfloat162 factor) {
  uint32_t x;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(x) : "r"(w), "n"(kSelector));
  const uint32_t bits = (x & 0x80008000u) | ((x & 0x7F007F00u) >> 4);
  __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits), factor);
  return *reinterpret_cast<uint32_t*>(&v);
}

// This thread's A fragment for the 4 k16 steps of a stage: rows g and g + 8 of its warp's 16,
// 16 codes each at q * 16 (codes within a 64-byte row permuted so k = 16 s + 8 h + 2 q + c
// sits at q * 16 + 4 s + 2 h + c), times the row's two block scales (blocks of 32 k).
struct AFragment {
  uint32_t a[4][4];  // [k16 step][register]
  __device__ void load(const uint8_t* codes, const __nv_bfloat162 (&f)[2][2]) {
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int row = 16 * warp + lane / 4, q = lane % 4;
    const uint4 lo = *reinterpret_cast<const uint4*>(codes + row * kK + q * 16);
    const uint4 hi = *reinterpret_cast<const uint4*>(codes + (row + 8) * kK + q * 16);
    const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w}, wh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int blk = s / 2;
      a[s][0] = codes_to_bf16x2<0x1404>(wl[s], f[0][blk]);
      a[s][1] = codes_to_bf16x2<0x1404>(wh[s], f[1][blk]);
      a[s][2] = codes_to_bf16x2<0x3424>(wl[s], f[0][blk]);
      a[s][3] = codes_to_bf16x2<0x3424>(wh[s], f[1][blk]);
    }
  }
};

__device__ __forceinline__ __nv_bfloat162 factor_of(int e) {
  // 2^(120 + e) with 120 + e in [-126, 127]: a normal bf16.
  const uint16_t b = static_cast<uint16_t>((120 + e + 127) << 7);
  __nv_bfloat162 f;
  f.x = *reinterpret_cast<const __nv_bfloat16*>(&b);
  f.y = f.x;
  return f;
}

struct Smem {
  alignas(1024) uint8_t b[kStages][kBBytes];
  alignas(1024) uint8_t a_bf16[kStages][kABf16Bytes];
  alignas(128) uint8_t a_codes[kStages][kACodeBytes];
};

enum Mode { kSS = 0, kRS = 1, kRSConvert = 2 };

// Every CTA fills its stages from global memory once, then each warpgroup runs `iters` stages.
template <int kMode>
__global__ void __launch_bounds__(256, 1)
    probe_kernel(const uint8_t* b_g, const uint8_t* a_bf16_g, const uint8_t* a_codes_g,
                 const int* scale_e, int iters, float* d_out) {
  extern __shared__ uint8_t raw[];
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  for (int i = threadIdx.x; i < kStages * kBBytes / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(s.b)[i] = reinterpret_cast<const uint4*>(b_g)[i % (kBBytes / 16)];
  }
  for (int i = threadIdx.x; i < kStages * kABf16Bytes / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(s.a_bf16)[i] =
        reinterpret_cast<const uint4*>(a_bf16_g)[i % (kABf16Bytes / 16)];
  }
  for (int i = threadIdx.x; i < kStages * kACodeBytes / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(s.a_codes)[i] =
        reinterpret_cast<const uint4*>(a_codes_g)[i % (kACodeBytes / 16)];
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int row = 64 * wg + 16 * warp + lane / 4;
  __nv_bfloat162 f[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) f[i][blk] = factor_of(scale_e[(row + 8 * i) * 2 + blk]);
  }
  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.f;
  // Two register sets, named statically (a runtime index would put them on the stack): the
  // MMAs of a stage read one while the next stage's fragment is converted into the other.
  AFragment frag0, frag1;
  if constexpr (kMode != kSS) frag0.load(s.a_codes[0] + wg * 64 * kK, f);
  auto step = [&](int it, AFragment& cur, AFragment& next) {
    const int stage = it % kStages;
    const uint64_t desc_b = smem_desc_k_major_sw128(s.b[stage]);
    wgmma_fence();
    if constexpr (kMode == kSS) {
      const uint64_t desc_a = smem_desc_k_major_sw128(s.a_bf16[stage] + wg * 64 * 128);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        wgmma_m64n128k16_bf16(d, desc_advance_k16(desc_a, k), desc_advance_k16(desc_b, k), 1);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) wgmma_m64n128k16_bf16_ra(d, cur.a[k], desc_advance_k16(desc_b, k), 1);
    }
    wgmma_commit();
    if constexpr (kMode == kRSConvert) {
      next.load(s.a_codes[(it + 1) % kStages] + wg * 64 * kK, f);
    } else if constexpr (kMode == kRS) {
      next = cur;
    }
    wgmma_wait<0>();
  };
  for (int it = 0; it < iters; it += 2) {  // iters is even
    step(it, frag0, frag1);
    if (it + 1 < iters) step(it + 1, frag1, frag0);
  }
  fence_accumulators(d);
  if (d_out != nullptr && blockIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < 64; ++i) d_out[(threadIdx.x) * 64 + i] = d[i];
  }
}

// ---------------------------------------------------------------------------------- host

static float e4m3_value(uint8_t c) {
  const int sign = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  const float v = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return sign ? -v : v;
}

static uint16_t bf16_bits(float v) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

int main() {
  srand(7);
  // A: 128 weight rows x 64 k of finite E4M3 codes (0x7F / 0xFF are NaN), all values present.
  std::vector<uint8_t> codes(kRows * kK);
  for (size_t i = 0; i < codes.size(); ++i) {
    uint8_t c = static_cast<uint8_t>(i * 37 + rand());
    if ((c & 0x7F) == 0x7F) c ^= 1;
    codes[i] = c;
  }
  std::vector<int> scale_e(kRows * 2);
  for (auto& e : scale_e) e = -20 + rand() % 28;  // 2^-20 .. 2^7
  // Fragment-permuted code rows; the same values as bf16 (exact) in a 128-byte swizzled tile.
  std::vector<uint8_t> codes_perm(kRows * kK);
  std::vector<uint16_t> a_bf16(kRows * kK);
  std::vector<float> a_val(kRows * kK);
  for (int r = 0; r < kRows; ++r) {
    for (int k = 0; k < kK; ++k) {
      const int s = k / 16, h = (k / 8) % 2, q = (k % 8) / 2, c = k % 2;
      codes_perm[r * kK + q * 16 + 4 * s + 2 * h + c] = codes[r * kK + k];
      const float v = std::ldexp(e4m3_value(codes[r * kK + k]), scale_e[r * 2 + k / 32]);
      a_val[r * kK + k] = v;
      const int chunk = (k / 8) ^ (r % 8);
      a_bf16[r * kK + chunk * 8 + k % 8] = bf16_bits(v);
    }
  }
  // B: 128 tokens x 64 k bf16, 128-byte swizzled rows.
  std::vector<uint16_t> b_bf16(kTokens * kK);
  std::vector<float> b_val(kTokens * kK);
  for (int n = 0; n < kTokens; ++n) {
    for (int k = 0; k < kK; ++k) {
      const uint16_t bits = bf16_bits((rand() / float(RAND_MAX) - 0.5f) * 4.f);
      b_val[n * kK + k] = bf16_value(bits);
      b_bf16[n * kK + ((k / 8) ^ (n % 8)) * 8 + k % 8] = bits;
    }
  }
  uint8_t *b_g, *a_bf16_g, *a_codes_g;
  int* e_g;
  float* d_g;
  CHECK(cudaMalloc(&b_g, kBBytes));
  CHECK(cudaMalloc(&a_bf16_g, kABf16Bytes));
  CHECK(cudaMalloc(&a_codes_g, kACodeBytes));
  CHECK(cudaMalloc(&e_g, scale_e.size() * sizeof(int)));
  CHECK(cudaMalloc(&d_g, 256 * 64 * sizeof(float)));
  CHECK(cudaMemcpy(b_g, b_bf16.data(), kBBytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(a_bf16_g, a_bf16.data(), kABf16Bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(a_codes_g, codes_perm.data(), kACodeBytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(e_g, scale_e.data(), scale_e.size() * sizeof(int), cudaMemcpyHostToDevice));
  const size_t smem = sizeof(Smem) + 1024;
  CHECK(cudaFuncSetAttribute(probe_kernel<kSS>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  CHECK(cudaFuncSetAttribute(probe_kernel<kRS>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  CHECK(cudaFuncSetAttribute(probe_kernel<kRSConvert>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));

  // (1) Exactness: one stage (iters = 1), both A forms against the host's exact products.
  for (int mode = 0; mode < 3; mode += 2) {
    CHECK(cudaMemset(d_g, 0xFF, 256 * 64 * sizeof(float)));  // poisoned (NaN)
    if (mode == kSS) {
      probe_kernel<kSS><<<1, 256, smem>>>(b_g, a_bf16_g, a_codes_g, e_g, 1, d_g);
    } else {
      probe_kernel<kRSConvert><<<1, 256, smem>>>(b_g, a_bf16_g, a_codes_g, e_g, 1, d_g);
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<float> d(256 * 64);
    CHECK(cudaMemcpy(d.data(), d_g, d.size() * 4, cudaMemcpyDeviceToHost));
    double err = 0, ref_norm = 0;
    int bad = 0;
    for (int t = 0; t < 256; ++t) {
      const int wg = t / 128, warp = (t % 128) / 32, lane = t % 32;
      for (int j = 0; j < 16; ++j) {
        for (int i = 0; i < 2; ++i) {
          for (int c = 0; c < 2; ++c) {
            const int r = 64 * wg + 16 * warp + lane / 4 + 8 * i;
            const int n = 8 * j + 2 * (lane % 4) + c;
            double ref = 0;
            for (int k = 0; k < kK; ++k) ref += double(a_val[r * kK + k]) * b_val[n * kK + k];
            const double got = d[t * 64 + 4 * j + 2 * i + c];
            if (!std::isfinite(got)) ++bad;
            err += (got - ref) * (got - ref);
            ref_norm += ref * ref;
          }
        }
      }
    }
    printf("exactness %s: rel-L2 %.3e vs exact products, %d non-finite\n",
           mode == kSS ? "SS (bf16 A in shared memory)" : "RS + conversion", std::sqrt(err / ref_norm), bad);
  }

  // (2) Rate.
  const int iters = 1 << 15;
  const int sms = 132;
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  const char* names[3] = {"SS", "RS (no conversion)", "RS + conversion"};
  for (int mode = 0; mode < 3; ++mode) {
    auto launch = [&] {
      if (mode == kSS) probe_kernel<kSS><<<sms, 256, smem>>>(b_g, a_bf16_g, a_codes_g, e_g, iters, nullptr);
      if (mode == kRS) probe_kernel<kRS><<<sms, 256, smem>>>(b_g, a_bf16_g, a_codes_g, e_g, iters, nullptr);
      if (mode == kRSConvert) probe_kernel<kRSConvert><<<sms, 256, smem>>>(b_g, a_bf16_g, a_codes_g, e_g, iters, nullptr);
    };
    launch();
    CHECK(cudaEventRecord(t0));
    launch();
    CHECK(cudaEventRecord(t1));
    CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    const double flops = double(sms) * 2 * iters * 64.0 * kTokens * kK * 2;
    printf("%-22s %8.1f TFLOP/s (%.3f ms)\n", names[mode], flops / (ms * 1e-3) / 1e12, ms);
  }
  return 0;
}
