// The source rank's fixed-order reduction over the slots the owners pushed back:
//   out[t] = round_bf16(slot[t, 0] + slot[t, 1] + ... + slot[t, K-1])   (fp32, this order)
// skipping unused slots (ids < 0), which nobody wrote. Timing cannot change the order.
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "common/vec.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"

namespace mok {

__global__ void reduce_slots_kernel(const __nv_bfloat16* __restrict__ slots,
                                    const int32_t* __restrict__ ids, int64_t tokens, int topk,
                                    int hidden, __nv_bfloat16* __restrict__ out) {
  const int vecs = hidden / 8;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k = 0; k < topk; ++k) {
        if (ids[t * topk + k] < 0) continue;
        Bf16x8 s;
        s.raw = reinterpret_cast<const int4*>(slots + (t * topk + k) * hidden)[v];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += __bfloat162float(s.v[j]);
      }
      Bf16x8 o;
#pragma unroll
      for (int j = 0; j < 8; ++j) o.v[j] = __float2bfloat16(acc[j]);
      reinterpret_cast<int4*>(out + t * hidden)[v] = o.raw;
    }
  }
}

__global__ void gather_slot_values_kernel(const float* __restrict__ values,
                                          const int32_t* __restrict__ ids, int64_t n,
                                          float* __restrict__ out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    out[i] = ids[i] >= 0 ? values[i] : 0.f;
  }
}

void reduce_slots(const at::Tensor& slots, const at::Tensor& ids, at::Tensor& out) {
  MOK_HOST_CHECK(ids.scalar_type() == at::kInt && ids.is_contiguous() && ids.dim() == 2,
                 "ids must be contiguous int32 [T, K]");
  const int64_t tokens = ids.size(0), topk = ids.size(1), hidden = out.size(1);
  MOK_HOST_CHECK(slots.scalar_type() == at::kBFloat16 && slots.is_contiguous() &&
                     slots.size(0) >= tokens * topk && slots.size(1) == hidden,
                 "slots must be contiguous bf16 [>= T*K, H]");
  MOK_HOST_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() &&
                     out.size(0) == tokens, "out must be contiguous bf16 [T, H]");
  MOK_HOST_CHECK(hidden % 8 == 0, "hidden size must be a multiple of 8");
  if (tokens == 0) return;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int blocks = static_cast<int>(std::min<int64_t>(tokens, sms * kBlocksPerSm));
  auto stream = at::cuda::getCurrentCUDAStream();
  reduce_slots_kernel<<<blocks, kReduceThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(slots.data_ptr()), ids.data_ptr<int32_t>(),
      tokens, static_cast<int>(topk), static_cast<int>(hidden),
      reinterpret_cast<__nv_bfloat16*>(out.data_ptr()));
  MOK_LAUNCH_CHECK();
}

void gather_slot_values(const at::Tensor& values, const at::Tensor& ids, at::Tensor& out) {
  MOK_HOST_CHECK(ids.scalar_type() == at::kInt && ids.is_contiguous(), "ids must be int32");
  MOK_HOST_CHECK(values.scalar_type() == at::kFloat && values.numel() >= ids.numel(),
                 "values must be fp32 with one entry per slot");
  MOK_HOST_CHECK(out.scalar_type() == at::kFloat && out.numel() == ids.numel() &&
                     out.is_contiguous(), "out must be contiguous fp32 shaped like ids");
  const int64_t n = ids.numel();
  if (n == 0) return;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int blocks = static_cast<int>(
      std::min<int64_t>((n + kReduceThreads - 1) / kReduceThreads, sms * kBlocksPerSm));
  auto stream = at::cuda::getCurrentCUDAStream();
  gather_slot_values_kernel<<<blocks, kReduceThreads, 0, stream>>>(
      values.data_ptr<float>(), ids.data_ptr<int32_t>(), n, out.data_ptr<float>());
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
