// Thread-block clusters of two CTAs (sm_90) that share an operand tile: each CTA's TMA loads
// half of it into the shared memory of both (multicast), so L2 serves each shared byte once per
// pair. A stage is then written by both CTAs' producers, so it is refilled only after the
// consumers of both CTAs have released it (a remote mbarrier arrive into the peer).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "gemm/sm90/tma.cuh"

namespace mok::sm90 {

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of both CTAs: the barriers each CTA initialised are visible to the other
// before either multicasts into it or arrives on them. .aligned: each warp reconverges first.
__device__ __forceinline__ void cluster_sync() {
  __syncwarp();
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Arrives on the mbarrier at `bar`'s offset in cluster CTA `cta`'s shared memory. Default
// (CTA-scope release) semantics: what it orders is this warpgroup's wgmma reads of the stage,
// already complete (wgmma_wait) before the arrive; a cluster-scope release on every stage
// release cost 1.2-1.6x the tile time in the BF16 engine's pair prototype (perf-log).
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)),
               "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

// tma_load_4d into `dst` of every CTA in `cta_mask`, completing on the mbarrier at `bar`'s
// offset in each of them.
__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const CUtensorMap* map,
                                                      uint64_t* bar, int c0, int c1, int c2,
                                                      int c3, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(cta_mask)
      : "memory");
}

}  // namespace mok::sm90
