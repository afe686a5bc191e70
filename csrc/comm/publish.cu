// Publishing a layer call's inputs into this rank's workspace, where the other ranks' kernels
// read them: the token rows (bf16; under an FP8 recipe quant/mx_round.cu's quantize_wire_rows
// publishes them instead), the routing (expert ids as int32, probs as fp32) and the token
// count, in one launch instead of a cast, three copies and a fill. ids32 receives the
// int32 ids as well: the workspace's copy is rewritten by the next layer's call, and backward
// needs this layer's. int64 ids are saturated to int32, never wrapped: an id beyond int32 must
// stay out of range for the schedule's check (a wrapped 2^32 + 1 would read as expert 1).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"

namespace mok {
namespace {

template <class Id>
__device__ __forceinline__ int32_t saturate_id(Id id) {
  if constexpr (sizeof(Id) > sizeof(int32_t)) {
    return static_cast<int32_t>(id < INT32_MIN ? INT32_MIN : id > INT32_MAX ? INT32_MAX : id);
  } else {
    return static_cast<int32_t>(id);
  }
}

template <class Id, class Prob>
__global__ void publish_inputs_kernel(const uint16_t* __restrict__ x, int64_t x_elems,
                                      bool vector_rows, const Id* __restrict__ ids,
                                      const Prob* __restrict__ probs, int64_t slots,
                                      int32_t tokens, uint16_t* __restrict__ ws_tokens,
                                      int32_t* __restrict__ ws_ids,
                                      float* __restrict__ ws_probs,
                                      int32_t* __restrict__ ws_count,
                                      int32_t* __restrict__ ids32) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vector_rows) {  // 16-byte vectors where both ends allow them (H % 8 == 0 is checked)
    const int4* src = reinterpret_cast<const int4*>(x);
    int4* dst = reinterpret_cast<int4*>(ws_tokens);
    for (int64_t i = first; i < x_elems / 8; i += stride) dst[i] = src[i];
  } else {
    for (int64_t i = first; i < x_elems; i += stride) ws_tokens[i] = x[i];
  }
  for (int64_t i = first; i < slots; i += stride) {
    const int32_t id = saturate_id(ids[i]);
    ws_ids[i] = id;
    ids32[i] = id;
    ws_probs[i] = static_cast<float>(probs[i]);
  }
  if (first == 0) *ws_count = tokens;
}

}  // namespace

void publish_inputs(const at::Tensor& x, const at::Tensor& ids, const at::Tensor& probs,
                    at::Tensor& buffer, int64_t tokens_offset, int64_t ids_offset,
                    int64_t probs_offset, int64_t count_offset, at::Tensor& ids32,
                    bool rows) {
  MOK_HOST_CHECK(x.is_cuda() && ids.is_cuda() && probs.is_cuda() && buffer.is_cuda() &&
                     ids32.is_cuda(),
                 "publish_inputs: all tensors must be on the GPU");
  MOK_HOST_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
                 "publish_inputs: x must be contiguous bf16 [T, H]");
  MOK_HOST_CHECK(x.size(1) % 8 == 0, "publish_inputs: H must be a multiple of 8");
  MOK_HOST_CHECK(ids.dim() == 2 && ids.size(0) == x.size(0) && ids.is_contiguous() &&
                     probs.sizes() == ids.sizes() && probs.is_contiguous(),
                 "publish_inputs: ids and probs must be contiguous [T, K]");
  MOK_HOST_CHECK(ids32.scalar_type() == at::kInt && ids32.sizes() == ids.sizes() &&
                     ids32.is_contiguous(),
                 "publish_inputs: ids32 must be contiguous int32 [T, K]");
  MOK_HOST_CHECK(buffer.scalar_type() == at::kByte && buffer.is_contiguous(),
                 "publish_inputs: the workspace buffer must be contiguous bytes");
  const int64_t tokens = x.size(0), slots = ids.numel();
  MOK_HOST_CHECK(tokens < (int64_t(1) << 31), "publish_inputs: too many tokens");
  uint8_t* base = buffer.data_ptr<uint8_t>();
  auto* ws_tokens = reinterpret_cast<uint16_t*>(base + tokens_offset);
  const bool vector_rows = reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                           reinterpret_cast<uintptr_t>(ws_tokens) % 16 == 0;
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t x_elems = rows ? x.numel() : 0;
  const int64_t work = std::max(x_elems / 8, slots);
  const int max_blocks = at::cuda::getCurrentDeviceProperties()->multiProcessorCount *
                         kBlocksPerSm;
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(max_blocks, (work + kActThreads - 1) / kActThreads)));
  auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto id_tag, auto prob_tag) {
    using Id = decltype(id_tag);
    using Prob = decltype(prob_tag);
    publish_inputs_kernel<Id, Prob><<<blocks, kActThreads, 0, stream>>>(
        reinterpret_cast<const uint16_t*>(x.data_ptr()), x_elems, vector_rows,
        reinterpret_cast<const Id*>(ids.data_ptr()),
        reinterpret_cast<const Prob*>(probs.data_ptr()), slots, static_cast<int32_t>(tokens),
        ws_tokens, reinterpret_cast<int32_t*>(base + ids_offset),
        reinterpret_cast<float*>(base + probs_offset),
        reinterpret_cast<int32_t*>(base + count_offset), ids32.data_ptr<int32_t>());
  };
  auto with_probs = [&](auto id_tag) {
    switch (probs.scalar_type()) {
      case at::kFloat: launch(id_tag, float{}); break;
      case at::kBFloat16: launch(id_tag, at::BFloat16{}); break;
      case at::kHalf: launch(id_tag, at::Half{}); break;
      default: MOK_HOST_CHECK(false, "publish_inputs: probs must be fp32, bf16 or fp16");
    }
  };
  switch (ids.scalar_type()) {
    case at::kLong: with_probs(int64_t{}); break;
    case at::kInt: with_probs(int32_t{}); break;
    default: MOK_HOST_CHECK(false, "publish_inputs: ids must be int32 or int64");
  }
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
