// The blockwise FP8 recipe's weight quantizer, bit for bit as
// mok_megatron/fp8_blockwise.py quantize_weight: w [E, N, K] cut into 128 x 128 blocks (the
// last ones along N and K short), each block one power-of-two scale 2^e from its amax by
// MXFP8's rule (quant/mx_format.cuh: mx_scale_exponent), its elements the nearest E4M3 codes
// of v / 2^e. The scale is stored as its E8M0 code (e + 127; 255 for a block holding a NaN or
// an Inf, whose codes are all NaN). A block's scale does not depend on the orientation, so
// the transposed weight (dgrad) is the transposed codes with the transposed scales.
//
// Codes rows are 16-byte aligned (K padded to 16 in the row stride: TMA's stride unit).
// One CTA per block: thread t holds rows t / 16 + 16 i (i < 8) and columns 8 (t % 16) .. + 7
// as 16-byte vectors (a row's 256 bytes are 16 consecutive threads), takes the block's amax
// with the others, then writes its 64 codes.
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "common/vec.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"
#include "quant/mx_format.cuh"

namespace mok {
namespace {

constexpr int kBlock = kFp8ScaleBlock;
constexpr int kThreads = 256;
constexpr int kVecsPerRow = kBlock / 8;
constexpr int kRowsPerPass = kThreads / kVecsPerRow;
constexpr int kPasses = kBlock / kRowsPerPass;

__global__ void __launch_bounds__(kThreads)
    quantize_weight_blocks_kernel(const __nv_bfloat16* __restrict__ w, int n, int k,
                                  uint8_t* __restrict__ codes, int64_t code_row,
                                  uint8_t* __restrict__ scales) {
  const int kb = blockIdx.x, nb = blockIdx.y, e = blockIdx.z;
  const int v = threadIdx.x % kVecsPerRow, r0 = threadIdx.x / kVecsPerRow;
  const int col = kb * kBlock + 8 * v;
  const int64_t matrix = int64_t(e) * n * k;
  Bf16x8 x[kPasses];
  float amax = 0.f;
  bool finite = true;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int row = nb * kBlock + r0 + kRowsPerPass * i;
    const bool here = row < n && col < k;  // k is a multiple of 8: whole vectors
    x[i].raw = here ? *reinterpret_cast<const int4*>(w + matrix + int64_t(row) * k + col)
                    : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float f = __bfloat162float(x[i].v[j]);
      const bool ok = isfinite(f);
      finite &= ok;
      if (ok) amax = fmaxf(amax, fabsf(f));
    }
  }
  // |v| >= 0: its bits order as the floats do, so the max of the bits is the max.
  __shared__ uint32_t warp_amax[kThreads / 32];
  __shared__ int warp_finite[kThreads / 32];
  uint32_t bits = __float_as_uint(amax);
  int ok = finite;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, d));
    ok &= __shfl_xor_sync(0xffffffffu, ok, d);
  }
  if (threadIdx.x % 32 == 0) {
    warp_amax[threadIdx.x / 32] = bits;
    warp_finite[threadIdx.x / 32] = ok;
  }
  __syncthreads();
  bits = 0;
  ok = 1;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) {
    bits = max(bits, warp_amax[i]);
    ok &= warp_finite[i];
  }
  const int ex = mx_scale_exponent(__uint_as_float(bits));
  if (threadIdx.x == 0) {
    const int row_blocks = (n + kBlock - 1) / kBlock, k_blocks = (k + kBlock - 1) / kBlock;
    scales[(int64_t(e) * row_blocks + nb) * k_blocks + kb] =
        ok ? static_cast<uint8_t>(ex + kE8m0Bias) : kE8m0Nan;
  }
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int row = nb * kBlock + r0 + kRowsPerPass * i;
    if (row >= n || col >= k) continue;
    uint8_t q[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = ok ? mx_code(__bfloat162float(x[i].v[j]), ex) : kE4m3Nan;
    *reinterpret_cast<uint2*>(codes + (int64_t(e) * n + row) * code_row + col) =
        *reinterpret_cast<const uint2*>(q);
  }
}

}  // namespace

void fp8_quantize_weight_blocks(const at::Tensor& w, at::Tensor& codes, at::Tensor& scales) {
  const char* what = "fp8_quantize_weight_blocks";
  MOK_HOST_CHECK(w.is_cuda() && w.dim() == 3 && w.scalar_type() == at::kBFloat16 &&
                     w.is_contiguous() && w.size(2) % 8 == 0,
                 what, ": w must be contiguous bf16 [E, N, K] on the GPU with K a multiple of "
                 "8, got ", w.sizes());
  const int64_t E = w.size(0), n = w.size(1), k = w.size(2);
  const int64_t row_blocks = (n + kBlock - 1) / kBlock, k_blocks = (k + kBlock - 1) / kBlock;
  MOK_HOST_CHECK(codes.device() == w.device() && codes.scalar_type() == at::kFloat8_e4m3fn &&
                     codes.sizes() == w.sizes() && codes.stride(2) == 1 &&
                     codes.stride(1) % 16 == 0 && codes.stride(0) == codes.stride(1) * n &&
                     reinterpret_cast<uintptr_t>(codes.data_ptr()) % 16 == 0,
                 what, ": codes must be float8_e4m3fn of w's shape on w's device, rows "
                 "16-byte aligned (K padded to 16) and evenly strided");
  MOK_HOST_CHECK(scales.device() == w.device() && scales.scalar_type() == at::kByte &&
                     scales.is_contiguous() && scales.dim() == 3 && scales.size(0) == E &&
                     scales.size(1) == row_blocks && scales.size(2) == k_blocks,
                 what, ": scales must be contiguous uint8 [", E, ", ", row_blocks, ", ",
                 k_blocks, "] on w's device, got ", scales.sizes());
  MOK_HOST_CHECK(row_blocks <= 65535 && E <= 65535, what, ": too many blocks for one launch");
  if (w.numel() == 0) return;
  quantize_weight_blocks_kernel<<<dim3(k_blocks, row_blocks, E), kThreads, 0,
                                  at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(w.data_ptr()), static_cast<int>(n),
      static_cast<int>(k), reinterpret_cast<uint8_t*>(codes.data_ptr()), codes.stride(1),
      scales.data_ptr<uint8_t>());
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
