// Expert activation with the router probability folded in, on the grouped-GEMM rows.
// Numerics match mok_megatron/reference/moe.py: fp32 math on bf16 inputs,
//   a = round_bf16(act(h) * p)                                  (forward)
//   dh = round_bf16(act'(h) * dA * p),  dp = sum_f dA * act(h)  (backward, fixed order)
// Only the first *num_rows rows are touched (a device-side count).
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "common/vec.cuh"
#include "config/kernel_config.cuh"
#include "epilogue/activation_math.cuh"
#include "ops.h"

namespace mok {

template <int kAct>
__global__ void activation_forward_kernel(const __nv_bfloat16* __restrict__ h,
                                          const float* __restrict__ row_prob,
                                          const int32_t* __restrict__ num_rows, int ffn,
                                          __nv_bfloat16* __restrict__ out) {
  constexpr bool kGated = is_gated(kAct);
  const int rows = *num_rows;
  const int vecs = ffn / 8;
  const int64_t h_stride = kGated ? 2 * ffn : ffn;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float p = row_prob[r];
    const int4* hin = reinterpret_cast<const int4*>(h + r * h_stride);
    int4* o = reinterpret_cast<int4*>(out + r * ffn);
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
      Bf16x8 gate, up, res;
      gate.raw = hin[v];
      if constexpr (kGated) up.raw = hin[vecs + v];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float a = act_eval<kAct>(__bfloat162float(gate.v[j])).f;
        if constexpr (kGated) a *= __bfloat162float(up.v[j]);
        res.v[j] = __float2bfloat16(a * p);
      }
      o[v] = res.raw;
    }
  }
}

template <int kAct>
__global__ void activation_backward_kernel(const __nv_bfloat16* __restrict__ h,
                                           const __nv_bfloat16* __restrict__ grad_out,
                                           const float* __restrict__ row_prob,
                                           const int32_t* __restrict__ num_rows, int ffn,
                                           __nv_bfloat16* __restrict__ grad_h,
                                           __nv_bfloat16* __restrict__ act_out,
                                           float* __restrict__ grad_prob) {
  constexpr bool kGated = is_gated(kAct);
  __shared__ float warp_sums[kActThreads / 32];
  const int rows = *num_rows;
  const int vecs = ffn / 8;
  const int64_t h_stride = kGated ? 2 * ffn : ffn;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float p = row_prob[r];
    const int4* hin = reinterpret_cast<const int4*>(h + r * h_stride);
    const int4* gin = reinterpret_cast<const int4*>(grad_out + r * ffn);
    int4* gh = reinterpret_cast<int4*>(grad_h + r * h_stride);
    int4* ao = reinterpret_cast<int4*>(act_out + r * ffn);
    float dp = 0.f;
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
      Bf16x8 gate, up, g, dgate, dup, a;
      gate.raw = hin[v];
      if constexpr (kGated) up.raw = hin[vecs + v];
      g.raw = gin[v];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const ActValue av = act_eval<kAct>(__bfloat162float(gate.v[j]));
        const float dout = __bfloat162float(g.v[j]);
        const float dact = dout * p;
        float act = av.f;
        if constexpr (kGated) {
          const float u = __bfloat162float(up.v[j]);
          act *= u;
          dgate.v[j] = __float2bfloat16(dact * u * av.df);
          dup.v[j] = __float2bfloat16(dact * av.f);
        } else {
          dgate.v[j] = __float2bfloat16(dact * av.df);
        }
        a.v[j] = __float2bfloat16(act * p);
        dp += dout * act;
      }
      gh[v] = dgate.raw;
      if constexpr (kGated) gh[vecs + v] = dup.raw;
      ao[v] = a.raw;
    }
    // Fixed-shape tree reduction (warp shuffles, then warp 0): the same order every run.
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dp += __shfl_xor_sync(0xffffffffu, dp, off);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = dp;
    __syncthreads();
    if (threadIdx.x < 32) {
      float s = threadIdx.x < kActThreads / 32 ? warp_sums[threadIdx.x] : 0.f;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (threadIdx.x == 0) grad_prob[r] = s;
    }
    __syncthreads();
  }
}

static int act_blocks() {
  return at::cuda::getCurrentDeviceProperties()->multiProcessorCount * kBlocksPerSm;
}

static void check_act(const at::Tensor& h, const at::Tensor& row_prob, int64_t activation,
                      int64_t ffn) {
  MOK_HOST_CHECK(activation >= kSwiglu && activation <= kSquaredRelu, "bad activation id ",
                 activation);
  MOK_HOST_CHECK(h.scalar_type() == at::kBFloat16 && h.is_contiguous(),
                 "activation input must be contiguous bf16");
  MOK_HOST_CHECK(ffn % 8 == 0, "FFN size ", ffn, " must be a multiple of 8");
  MOK_HOST_CHECK(h.size(1) == (is_gated(activation) ? 2 * ffn : ffn),
                 "activation input width does not match the FFN size");
  MOK_HOST_CHECK(row_prob.scalar_type() == at::kFloat && row_prob.numel() >= h.size(0),
                 "row_prob must be fp32 with one entry per row");
}

void activation_forward(const at::Tensor& h, const at::Tensor& row_prob,
                        const at::Tensor& num_rows, int64_t activation, at::Tensor& out) {
  const int64_t ffn = out.size(1);
  check_act(h, row_prob, activation, ffn);
  MOK_HOST_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() &&
                     out.size(0) == h.size(0), "activation output must be bf16 [rows, F]");
  auto stream = at::cuda::getCurrentCUDAStream();
  MOK_DISPATCH_ACTIVATION(activation, KACT,
      activation_forward_kernel<KACT><<<act_blocks(), kActThreads, 0, stream>>>(
          reinterpret_cast<const __nv_bfloat16*>(h.data_ptr()), row_prob.data_ptr<float>(),
          num_rows.data_ptr<int32_t>(), static_cast<int>(ffn),
          reinterpret_cast<__nv_bfloat16*>(out.data_ptr())));
  MOK_LAUNCH_CHECK();
}

void activation_backward(const at::Tensor& h, const at::Tensor& grad_out,
                         const at::Tensor& row_prob, const at::Tensor& num_rows,
                         int64_t activation, at::Tensor& grad_h, at::Tensor& act_out,
                         at::Tensor& grad_prob) {
  const int64_t ffn = grad_out.size(1);
  check_act(h, row_prob, activation, ffn);
  MOK_HOST_CHECK(grad_out.scalar_type() == at::kBFloat16 && grad_out.is_contiguous(),
                 "grad_out must be contiguous bf16");
  MOK_HOST_CHECK(grad_h.sizes() == h.sizes() && grad_h.is_contiguous(), "grad_h must match h");
  MOK_HOST_CHECK(act_out.sizes() == grad_out.sizes() && act_out.is_contiguous(),
                 "act_out must match grad_out");
  MOK_HOST_CHECK(grad_prob.scalar_type() == at::kFloat && grad_prob.numel() >= h.size(0),
                 "grad_prob must be fp32 with one entry per row");
  auto stream = at::cuda::getCurrentCUDAStream();
  MOK_DISPATCH_ACTIVATION(activation, KACT,
      activation_backward_kernel<KACT><<<act_blocks(), kActThreads, 0, stream>>>(
          reinterpret_cast<const __nv_bfloat16*>(h.data_ptr()),
          reinterpret_cast<const __nv_bfloat16*>(grad_out.data_ptr()),
          row_prob.data_ptr<float>(), num_rows.data_ptr<int32_t>(), static_cast<int>(ffn),
          reinterpret_cast<__nv_bfloat16*>(grad_h.data_ptr()),
          reinterpret_cast<__nv_bfloat16*>(act_out.data_ptr()), grad_prob.data_ptr<float>()));
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
