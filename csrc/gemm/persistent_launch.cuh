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

// The same in clusters of `cluster_ctas` blocks, as many clusters as can be resident at once
// (cudaOccupancyMaxActiveClusters: an SM count that does not split into whole clusters, or
// GPCs with an odd SM count, leave SMs idle).
template <class... Params, class... Args>
void launch_persistent_clusters(void (*kernel)(Params...), size_t smem_bytes, int cluster_ctas,
                                Args&&... args) {
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes)));
  cudaLaunchAttribute cluster_dim;
  cluster_dim.id = cudaLaunchAttributeClusterDimension;
  cluster_dim.val.clusterDim.x = cluster_ctas;
  cluster_dim.val.clusterDim.y = 1;
  cluster_dim.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  config.blockDim = dim3(kGemmThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = at::cuda::getCurrentCUDAStream();
  config.attrs = &cluster_dim;
  config.numAttrs = 1;
  int clusters = 0;
  MOK_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  MOK_HOST_CHECK(clusters > 0, "no cluster of ", cluster_ctas, " blocks fits on this GPU");
  config.gridDim = dim3(clusters * cluster_ctas);
  MOK_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
