// MXFP8's number format on the device, shared by the quantizers (quant/mx_round.cu), the
// GEMM stages that dequantize weights (gemm/sm90/mx_weight_stage.cuh) and the pull that
// dequantizes wire rows (comm/rows.cu), so all produce the same bf16 values bit for bit: an
// E4M3 code times 2^e, e from an E8M0 scale code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/vec.cuh"

namespace mok {

constexpr float kRcpE4m3Max = 1.0f / 448.0f;  // fp32(1/448), as mxfp8._RCP_E4M3_MAX
constexpr int kE8m0Bias = 127;
constexpr uint8_t kE8m0Nan = 0xFF;  // a block with a NaN or an Inf
constexpr uint8_t kE4m3Nan = 0x7F;

// mxfp8.scale_exponent: the exponent of amax * fp32(1/448) rounded up unless it is a power
// of two, clamped to E8M0's [-127, 127].
__device__ __forceinline__ int mx_scale_exponent(float amax) {
  const uint32_t bits = __float_as_uint(__fmul_rn(amax, kRcpE4m3Max));
  const int biased = static_cast<int>((bits >> 23) & 0xFF);
  const int e = biased > 0 ? biased - 127 + ((bits & 0x7FFFFF) != 0) : -127;
  return max(-127, min(127, e));
}

// 2^k exactly for k in [-127, 127] (2^-127 is an fp32 subnormal).
__device__ __forceinline__ float exact_exp2(int k) {
  return k >= -126 ? __uint_as_float(static_cast<uint32_t>(k + 127) << 23)
                   : __uint_as_float(0x400000u);
}

// The E4M3 code of v at scale 2^e. SATFINITE gives what the reference's clamp to +-448
// before its cast gives.
__device__ __forceinline__ __nv_fp8_storage_t mx_code(float v, int e) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, exact_exp2(-e)), __NV_SATFINITE, __NV_E4M3);
}

// The value of a code at scale 2^e, in fp32 (exact above 2^-126 as the product has at most
// 4 significant bits; below, fp32's rounding - the same here and in every dequantizer).
__device__ __forceinline__ float mx_value(__nv_fp8_storage_t q, int e) {
  return __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3))), exact_exp2(e));
}

// An E8M0 scale code as the fp32 factor 2^(code - 127); NaN for the NaN code.
__device__ __forceinline__ float e8m0_factor(uint8_t code) {
  return code == kE8m0Nan ? __uint_as_float(0x7FC00000u) : exact_exp2(int(code) - kE8m0Bias);
}

// The two E4M3 codes in the low 16 bits of `pair` times `factor` (e8m0_factor of their
// block's scale code) as a bf16 pair: mx_value of each, rounded to bf16 as mx_round does.
__device__ __forceinline__ uint32_t dequantize_pair(uint32_t pair, float factor) {
  const auto two = static_cast<__nv_fp8x2_storage_t>(pair);
  const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3)));
  return pack_bf16x2(__fmul_rn(f.x, factor), __fmul_rn(f.y, factor));
}

}  // namespace mok
