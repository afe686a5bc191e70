// The blockwise FP8 recipe's weight quantizer, bit for bit as
// mok_megatron/recipes/fp8_blockwise.py quantize_weight: w [E, N, K] cut into 128 x 128 blocks (the
// last ones along N and K short), each block one power-of-two scale 2^e from its amax by
// MXFP8's rule (quant/mx_format.cuh: mx_scale_exponent), its elements the nearest E4M3 codes
// of v / 2^e. The scale is stored as its E8M0 code (e + 127; 255 for a block holding a NaN or
// an Inf, whose codes are all NaN). A block's scale does not depend on the orientation, so
// the transposed weight (dgrad) is the transposed codes with the transposed scales.
//
// Codes rows are 16-byte aligned (K padded to 16 in the row stride: TMA's stride unit).
// One CTA per block: thread t holds rows t / 16 + 16 i (i < 8) and columns 8 (t % 16) .. + 7
// as 16-byte vectors (a row's 256 bytes are 16 consecutive threads), takes the block's amax
// with the others, then writes its 64 codes - and, asked for the other orientation too, the
// block through shared memory transposed: codes_t [E, K, N] (N padded to 16) and scales_t
// [E, ceil(K / 128), ceil(N / 128)], the dgrads' weights, from the same rounding.
// `only_if` (optional, device int): the launch writes nothing while it reads 0 - a quantization
// captured in a CUDA graph then runs only when the weights changed (fp8_block_weights.py).
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

// The block's codes staged for the transposed write: rows 8-byte aligned for the vector
// stores, 136 bytes apart so a warp's transposed reads fall on 2 banks per 4 bytes, not 1.
constexpr int kTileRow = kBlock + 8;

struct Transposed {
  uint8_t* codes;  // nullptr: one orientation only
  int64_t code_row;
  uint8_t* scales;
};

__global__ void __launch_bounds__(kThreads)
    quantize_weight_blocks_kernel(const __nv_bfloat16* __restrict__ w, int n, int k,
                                  uint8_t* __restrict__ codes, int64_t code_row,
                                  uint8_t* __restrict__ scales, Transposed t_out,
                                  const int* __restrict__ only_if) {
  if (only_if != nullptr && *only_if == 0) return;
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
    const uint8_t code = ok ? static_cast<uint8_t>(ex + kE8m0Bias) : kE8m0Nan;
    scales[(int64_t(e) * row_blocks + nb) * k_blocks + kb] = code;
    if (t_out.codes != nullptr) t_out.scales[(int64_t(e) * k_blocks + kb) * row_blocks + nb] = code;
  }
  __shared__ alignas(8) uint8_t tile[kBlock][kTileRow];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int r = r0 + kRowsPerPass * i, row = nb * kBlock + r;
    uint8_t q[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = ok ? mx_code(__bfloat162float(x[i].v[j]), ex) : kE4m3Nan;
    if (t_out.codes != nullptr) {
      *reinterpret_cast<uint2*>(&tile[r][8 * v]) = *reinterpret_cast<const uint2*>(q);
    }
    if (row >= n || col >= k) continue;
    *reinterpret_cast<uint2*>(codes + (int64_t(e) * n + row) * code_row + col) =
        *reinterpret_cast<const uint2*>(q);
  }
  if (t_out.codes == nullptr) return;
  __syncthreads();
  // Transposed: thread t writes 8 codes of transposed row (block column) r0 + 16 i, the block
  // rows 8 v .. 8 v + 7; a row's chunk past n lands in its 16-byte padding, never read.
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int c = r0 + kRowsPerPass * i, t_row = kb * kBlock + c, t_col = nb * kBlock + 8 * v;
    if (t_row >= k || t_col >= n) continue;
    uint8_t q[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = tile[8 * v + j][c];
    *reinterpret_cast<uint2*>(t_out.codes + (int64_t(e) * k + t_row) * t_out.code_row + t_col) =
        *reinterpret_cast<const uint2*>(q);
  }
}

}  // namespace

void fp8_quantize_weight_blocks(const at::Tensor& w, at::Tensor& codes, at::Tensor& scales,
                                const c10::optional<at::Tensor>& codes_t,
                                const c10::optional<at::Tensor>& scales_t,
                                const c10::optional<at::Tensor>& only_if) {
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
  MOK_HOST_CHECK(codes_t.has_value() == scales_t.has_value(), what,
                 ": the transposed codes and scales come together");
  Transposed t_out{nullptr, 0, nullptr};
  if (codes_t.has_value()) {
    const at::Tensor& ct = *codes_t;
    const at::Tensor& st = *scales_t;
    MOK_HOST_CHECK(ct.device() == w.device() && ct.scalar_type() == at::kFloat8_e4m3fn &&
                       ct.dim() == 3 && ct.size(0) == E && ct.size(1) == k && ct.size(2) == n &&
                       ct.stride(2) == 1 && ct.stride(1) >= (n + 15) / 16 * 16 &&
                       ct.stride(1) % 16 == 0 && ct.stride(0) == ct.stride(1) * k &&
                       reinterpret_cast<uintptr_t>(ct.data_ptr()) % 16 == 0,
                   what, ": codes_t must be float8_e4m3fn [E, K, N] on w's device, rows padded "
                   "to 16 bytes and evenly strided, got ", ct.sizes());
    MOK_HOST_CHECK(st.device() == w.device() && st.scalar_type() == at::kByte &&
                       st.is_contiguous() && st.dim() == 3 && st.size(0) == E &&
                       st.size(1) == k_blocks && st.size(2) == row_blocks,
                   what, ": scales_t must be contiguous uint8 [", E, ", ", k_blocks, ", ",
                   row_blocks, "] on w's device, got ", st.sizes());
    t_out = {reinterpret_cast<uint8_t*>(ct.data_ptr()), ct.stride(1), st.data_ptr<uint8_t>()};
  }
  const int* flag = nullptr;
  if (only_if.has_value()) {
    MOK_HOST_CHECK(only_if->device() == w.device() && only_if->scalar_type() == at::kInt &&
                       only_if->numel() == 1,
                   what, ": only_if must be one int32 on w's device");
    flag = only_if->data_ptr<int32_t>();
  }
  if (w.numel() == 0) return;
  quantize_weight_blocks_kernel<<<dim3(k_blocks, row_blocks, E), kThreads, 0,
                                  at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(w.data_ptr()), static_cast<int>(n),
      static_cast<int>(k), reinterpret_cast<uint8_t*>(codes.data_ptr()), codes.stride(1),
      scales.data_ptr<uint8_t>(), t_out, flag);
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
