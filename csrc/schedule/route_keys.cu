// Schedule, step 1: every owner reads all ranks' published routing through peer memory and
// emits one sort key per (source rank, token, slot):
//   key = position(local expert) * N + flat    if the slot routes to one of our experts
//   key = num_local_experts * N + flat         otherwise (sorts past every real row)
// with flat = source * max_tokens * topk + token * topk + slot and N = world * max_tokens *
// topk. Keys are unique, so sorting them gives one fixed order - expert, then source rank,
// then token, then slot - whatever the arrival timing: this is what makes results
// deterministic. The sort and the per-expert offsets are torch ops on the device.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"

namespace mok {

__global__ void route_keys_kernel(const int64_t* __restrict__ peer_bases, int64_t ids_offset,
                                  int64_t probs_offset, int64_t count_offset, int world,
                                  int64_t max_tokens, int topk, int expert_begin,
                                  int num_local, const int32_t* __restrict__ expert_position,
                                  int64_t* __restrict__ keys, float* __restrict__ probs_out) {
  __shared__ int32_t tokens_of[kMaxRanks];
  if (threadIdx.x < world) {
    tokens_of[threadIdx.x] =
        *reinterpret_cast<const int32_t*>(peer_bases[threadIdx.x] + count_offset);
  }
  __syncthreads();
  const int64_t per_rank = max_tokens * topk;
  const int64_t n = per_rank * world;
  for (int64_t flat = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; flat < n;
       flat += (int64_t)gridDim.x * blockDim.x) {
    const int src = static_cast<int>(flat / per_rank);
    const int64_t local = flat - src * per_rank;
    int64_t key = num_local * n + flat;
    float prob = 0.f;
    if (local / topk < tokens_of[src]) {
      const int32_t id = reinterpret_cast<const int32_t*>(peer_bases[src] + ids_offset)[local];
      const int e = id - expert_begin;
      if (id >= 0 && e >= 0 && e < num_local) {
        key = expert_position[e] * n + flat;
        prob = reinterpret_cast<const float*>(peer_bases[src] + probs_offset)[local];
      }
    }
    keys[flat] = key;
    probs_out[flat] = prob;
  }
}

void route_keys(const at::Tensor& peer_bases, int64_t ids_offset, int64_t probs_offset,
                int64_t count_offset, int64_t world, int64_t max_tokens, int64_t topk,
                int64_t expert_begin, const at::Tensor& expert_position, at::Tensor& keys,
                at::Tensor& probs_out) {
  MOK_HOST_CHECK(world >= 1 && world <= kMaxRanks, "EP size ", world, " outside [1, ",
                 kMaxRanks, "]");
  const int64_t n = world * max_tokens * topk;
  MOK_HOST_CHECK(keys.numel() == n && probs_out.numel() == n, "route_keys: outputs must hold ",
                 n, " entries");
  const int num_local = static_cast<int>(expert_position.numel());
  MOK_HOST_CHECK(static_cast<double>(num_local + 1) * n < 9.0e18, "route_keys: key overflow");
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t want = (n + kKeysThreads - 1) / kKeysThreads;
  const int blocks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(want, static_cast<int64_t>(sms) * kBlocksPerSm)));
  auto stream = at::cuda::getCurrentCUDAStream();
  route_keys_kernel<<<blocks, kKeysThreads, 0, stream>>>(
      peer_bases.data_ptr<int64_t>(), ids_offset, probs_offset, count_offset,
      static_cast<int>(world), max_tokens, static_cast<int>(topk),
      static_cast<int>(expert_begin), num_local, expert_position.data_ptr<int32_t>(),
      keys.data_ptr<int64_t>(), probs_out.data_ptr<float>());
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
