// Host side of the engine's persistent kernels (grouped GEMM, forward megakernel): one block
// of kGemmThreads per SM, with `smem_bytes` of dynamic shared memory, on the current stream.
#pragma once

#include <ATen/cuda/CUDAContext.h>

#include <utility>

#include "common/error.cuh"
#include "config/kernel_config.cuh"

namespace mok {

template <class... Params, class... Args>
void launch_persistent(void (*kernel)(Params...), size_t smem_bytes, Args&&... args) {
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes)));
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  kernel<<<sms, kGemmThreads, smem_bytes, at::cuda::getCurrentCUDAStream()>>>(
      std::forward<Args>(args)...);
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
