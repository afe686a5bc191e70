// Thread-block clusters (sm_90): two CTAs of a cluster share operand loads - one TMA load
// lands in both CTAs' shared memory (multicast), and a stage is refilled only after the
// consumers of both CTAs have released it (remote mbarrier arrives).
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

// All threads of all CTAs of the cluster: every CTA's barriers are initialised (at the start)
// and no CTA still writes into another's shared memory (before exit). The barrier is
// .aligned, so each warp reconverges first (callers arrive from lane-divergent branches).
__device__ __forceinline__ void cluster_sync() {
  __syncwarp();
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Arrives on the mbarrier at `bar`'s offset in the shared memory of cluster CTA `cta`
// (release at cluster scope: this CTA's reads of the stage come before the refill).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(cta));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote)
               : "memory");
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
