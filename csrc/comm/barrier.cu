// Device-side barrier over ordinary peer stores and flags (no NVLink multicast).
//
// Every rank keeps, per channel, a local epoch counter (plain device memory) and, in its
// symmetric workspace, one flag slot per source rank. A barrier bumps the epoch, writes it
// into slot [rank] of every peer, then waits until all of its own slots reach it. All ranks
// run the same sequence of barriers on a channel, so their epochs agree; a peer may already
// have written the next epoch into our slot, hence the wait for "at least" (signed distance).
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "common/ptx.cuh"
#include "common/stages.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"

namespace mok {

__global__ void peer_barrier_kernel(const int64_t* __restrict__ peer_bases, int64_t flags_offset,
                                    int32_t* __restrict__ epochs, int channel, int rank,
                                    int world, uint64_t timeout_ns, int stage) {
  __shared__ uint32_t epoch;
  const int peer = threadIdx.x;
  if (peer == 0) {
    epoch = static_cast<uint32_t>(epochs[channel]) + 1u;
    epochs[channel] = static_cast<int32_t>(epoch);
  }
  __syncthreads();
  if (peer >= world) return;

  // Orders every write this GPU made before this kernel (earlier kernels' pushes into peer
  // memory included) before the flag below, for observers on any GPU.
  __threadfence_system();
  auto* peer_flags = reinterpret_cast<uint32_t*>(peer_bases[peer] + flags_offset);
  st_release_sys_u32(peer_flags + channel * kMaxRanks + rank, epoch);

  // Acquire: once a peer's flag is seen, everything it wrote before raising it is visible
  // to this GPU, and to the kernels launched after this one.
  auto* my_flags = reinterpret_cast<const uint32_t*>(peer_bases[rank] + flags_offset);
  const uint32_t* slot = my_flags + channel * kMaxRanks + peer;
  const uint64_t start = globaltimer_ns();
  uint32_t seen = ld_acquire_sys_u32(slot);
  while (static_cast<int32_t>(seen - epoch) < 0) {
    if (globaltimer_ns() - start > timeout_ns) {
      printf("mok_megatron: TIMEOUT rank %d stage %d (%s): waited %llu ms for peer %d on "
             "barrier channel %d, expected epoch %u, flag holds %u\n",
             rank, stage, stage_name(stage), (unsigned long long)(timeout_ns / 1000000), peer,
             channel, epoch, seen);
      __trap();
    }
    seen = ld_acquire_sys_u32(slot);
  }
}

void peer_barrier(const at::Tensor& peer_bases, int64_t flags_offset, at::Tensor& epochs,
                  int64_t channel, int64_t rank, int64_t world, int64_t timeout_ns,
                  int64_t stage) {
  MOK_HOST_CHECK(world >= 1 && world <= kMaxRanks, "EP size ", world, " outside [1, ",
                 kMaxRanks, "]");
  MOK_HOST_CHECK(channel >= 0 && channel < kNumBarrierChannels, "bad barrier channel ", channel);
  auto stream = at::cuda::getCurrentCUDAStream();
  peer_barrier_kernel<<<1, 32, 0, stream>>>(
      peer_bases.data_ptr<int64_t>(), flags_offset, epochs.data_ptr<int32_t>(),
      static_cast<int>(channel), static_cast<int>(rank), static_cast<int>(world),
      static_cast<uint64_t>(timeout_ns), static_cast<int>(stage));
  MOK_LAUNCH_CHECK();
}

// A wait that nobody satisfies, to prove that a stall ends in the timeout report (tests).
__global__ void stall_for_test_kernel(const uint32_t* flag, int rank, uint64_t timeout_ns) {
  const uint64_t start = globaltimer_ns();
  uint32_t seen = ld_acquire_sys_u32(flag);
  while (seen == 0u) {
    if (globaltimer_ns() - start > timeout_ns) {
      printf("mok_megatron: TIMEOUT rank %d stage %d (%s): waited %llu ms for a flag that "
             "never came, flag holds %u\n",
             rank, kStageTest, stage_name(kStageTest),
             (unsigned long long)(timeout_ns / 1000000), seen);
      __trap();
    }
    seen = ld_acquire_sys_u32(flag);
  }
}

void stall_for_test(at::Tensor& flag, int64_t rank, int64_t timeout_ns) {
  auto stream = at::cuda::getCurrentCUDAStream();
  stall_for_test_kernel<<<1, 1, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(flag.data_ptr<int32_t>()), static_cast<int>(rank),
      static_cast<uint64_t>(timeout_ns));
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
