// Error handling: host checks throw (Python sees a RuntimeError naming what and where);
// device code never exits, it prints and traps.
#pragma once

#include <cuda_runtime.h>
#include <c10/util/Exception.h>

#define MOK_HOST_CHECK(cond, ...) TORCH_CHECK((cond), "mok_megatron: ", __VA_ARGS__)

#define MOK_CUDA_CHECK(expr)                                                              \
  do {                                                                                    \
    cudaError_t mok_err_ = (expr);                                                        \
    TORCH_CHECK(mok_err_ == cudaSuccess, "mok_megatron: CUDA error ", #expr, " at ",      \
                __FILE__, ":", __LINE__, ": ", cudaGetErrorString(mok_err_));             \
  } while (0)

// After every launch: a bad configuration shows up here, not at the next sync.
#define MOK_LAUNCH_CHECK() MOK_CUDA_CHECK(cudaGetLastError())
