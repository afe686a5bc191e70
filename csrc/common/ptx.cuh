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

// Nanoseconds of wall-clock time; coarse (microsecond ticks) but shared by all SMs, which
// makes it the right clock for a timeout.
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace mok
