// Megatron's routing map [T, E] (bool) becomes top-k expert ids in routing.py by keeping each
// token's selected experts in expert order, at most topk of them. A map that selects more for
// some token (Megatron pads experts to capacity at run time: its inference CUDA graphs'
// expert padding) would lose that token's other experts, so it is an error, caught here on
// the GPU without a host sync: a warp per token counts its selected experts and, past topk,
// prints the token and its count and traps - as the schedule does for a bad expert id.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "ops.h"

namespace mok {
namespace {

constexpr int kCheckThreads = 256;
constexpr int kCheckWarps = kCheckThreads / 32;

__global__ void check_routing_map_kernel(const bool* __restrict__ map, int64_t tokens,
                                         int64_t experts, int64_t row_stride, int topk,
                                         int64_t rank) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kCheckWarps;
  for (int64_t t = int64_t(blockIdx.x) * kCheckWarps + threadIdx.x / 32; t < tokens;
       t += warps) {
    const bool* row = map + t * row_stride;
    int selected = 0;
    for (int64_t e = lane; e < experts; e += 32) selected += row[e] ? 1 : 0;
#pragma unroll
    for (int d = 16; d > 0; d /= 2) selected += __shfl_xor_sync(0xffffffffu, selected, d);
    if (selected > topk && lane == 0) {
      printf("mok_megatron: ROUTING MAP (rank %lld): token %lld selects %d experts, more than "
             "moe_router_topk = %d; mok takes each token's top-k experts and cannot run a "
             "padded routing map (Megatron's expert padding to capacity)\n",
             (long long)rank, (long long)t, selected, topk);
      __trap();
    }
  }
}

}  // namespace

void check_routing_map(const at::Tensor& routing_map, int64_t topk, int64_t rank) {
  MOK_HOST_CHECK(routing_map.is_cuda() && routing_map.scalar_type() == at::kBool &&
                     routing_map.dim() == 2 && routing_map.stride(1) == 1,
                 "check_routing_map: routing_map must be a bool [T, E] CUDA tensor with "
                 "contiguous rows");
  const int64_t tokens = routing_map.size(0);
  if (tokens == 0) return;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t blocks = std::min<int64_t>((tokens + kCheckWarps - 1) / kCheckWarps, 4 * sms);
  check_routing_map_kernel<<<blocks, kCheckThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      routing_map.data_ptr<bool>(), tokens, routing_map.size(1), routing_map.stride(0),
      static_cast<int>(topk), rank);
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
