// PTX helpers for cross-GPU signalling. Each name states its ordering and scope.
// Peer memory is mapped over NVLink, so flags that another GPU reads or writes need the
// .sys scope; a .gpu-scope operation does not order against the peer's accesses.
#pragma once

#include <cstdint>

namespace mok {

__device__ __forceinline__ uint32_t ld_acquire_sys_u32(const uint32_t* ptr) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys_u32(uint32_t* ptr, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}

// Counters between blocks of one GPU (rows pulled, tiles finished): release on the writer,
// acquire on the reader.
__device__ __forceinline__ uint32_t ld_acquire_gpu_u32(const uint32_t* ptr) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}

__device__ __forceinline__ void red_release_gpu_add_u32(uint32_t* ptr, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}

// Orders this thread's earlier generic-proxy view of global memory (e.g. rows another block
// wrote, seen through an acquire) before its later async-proxy (TMA) reads.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Nanoseconds of wall-clock time; coarse (microsecond ticks) but shared by all SMs, which
// makes it the right clock for a timeout.
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace mok
