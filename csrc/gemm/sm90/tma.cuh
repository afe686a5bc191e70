// Hopper TMA loads and the shared-memory mbarriers that count their bytes. sm_90a only.
//
// A stage of a pipeline has two barriers: `full` (count 1: the producer's arrive carries the
// expected transaction bytes; TMA completes them) and `empty` (one arrive per consumer
// warpgroup once its MMAs have read the stage). Waits take a parity: the phase of the barrier
// being waited for, flipping each time the stage ring wraps.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/ptx.cuh"

namespace mok::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Shared-space loads of 16 bytes, of one byte and of fp32 vectors (a generic pointer into
// dynamic shared memory otherwise compiles to a generic load). Volatile: each stays after the
// barrier wait that made the bytes visible.
__device__ __forceinline__ uint4 ld_shared_16(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr(p)));
  return v;
}

__device__ __forceinline__ uint8_t ld_shared_u8(const void* p) {
  uint16_t v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=h"(v) : "r"(smem_addr(p)));
  return static_cast<uint8_t>(v);
}

__device__ __forceinline__ void ld_shared_f32x4(const float* p, float& a, float& b, float& c,
                                                float& d) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(a), "=f"(b), "=f"(c), "=f"(d)
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ld_shared_f32x2(const float* p, float& a, float& b) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(a), "=f"(b) : "r"(smem_addr(p)));
}

// Shared-space stores, ordered before a later barrier arrive (volatile, memory clobber).
__device__ __forceinline__ void st_shared_f32x4(float* p, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr(p)), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

__device__ __forceinline__ void st_shared_f32x2(float* p, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(smem_addr(p)), "f"(a), "f"(b)
               : "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

// Makes mbarrier initialisation visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Bounded wait: a pipeline that never fills (a bad descriptor, a lost TMA) traps instead of
// hanging the GPU, after leaving {role, block, tile, stage} in `report` (host-mapped memory
// the host reads after the trap). No printf: a printf is a function call, and ptxas then
// serializes every wgmma of the kernel.
__device__ __forceinline__ void trap_with_report(int* report, int role, int tile, int stage) {
  report[0] = role;
  report[1] = blockIdx.x;
  report[2] = tile;
  report[3] = stage;
  __threadfence_system();
  __trap();
}

// Spins until ready() holds; gives up after timeout_ns through trap_with_report.
template <class Ready>
__device__ __forceinline__ void bounded_wait(Ready ready, uint64_t timeout_ns, int role, int tile,
                                             int stage, int* report) {
  if (ready()) return;
  const uint64_t start = globaltimer_ns();
  while (!ready()) {
    if (globaltimer_ns() - start > timeout_ns) trap_with_report(report, role, tile, stage);
  }
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity, uint64_t timeout_ns,
                                          int role, int tile, int stage, int* report) {
  bounded_wait([&] { return mbar_try_wait(bar, parity); }, timeout_ns, role, tile, stage,
               report);
}

// mbar_wait without a timeout, for a wait whose stall another role's bounded wait is certain
// to report (the wide FP8 tiles' consumers: their producer waits bounded for every stage's
// release, fp8_mainloop.cuh): without the trap in their path they keep the registers
// setmaxnreg gives them (with bounded waits ptxas spilled 560 bytes there, without 16).
__device__ __forceinline__ void mbar_wait_unbounded(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// Until a counter another block of this GPU raises (release) reaches `target` (acquire).
__device__ __forceinline__ void counter_wait(const uint32_t* counter, uint32_t target,
                                             uint64_t timeout_ns, int role, int tile, int stage,
                                             int* report) {
  bounded_wait([&] { return ld_acquire_gpu_u32(counter) >= target; }, timeout_ns, role, tile,
               stage, report);
}

// 4-D tiled TMA load into shared memory, completing on `bar`. Coordinates are in elements,
// innermost first.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// 1-D bulk copy (TMA without a tensor map) of `bytes` (a multiple of 16, both addresses
// 16-byte aligned) from global memory - local, or a peer's over NVLink - into shared memory,
// completing on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// 1-D bulk copy shared -> global, tracked by this thread's bulk groups (bulk_commit,
// bulk_wait).
__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most `kPending` of this thread's committed bulk groups are unfinished; the
// finished ones' writes are then performed (not only their shared-memory reads).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

// Waits until at most `kPending` of this thread's committed bulk groups still read their
// shared-memory source (their slots can be reused; the writes may still be in flight).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// 4-D tiled TMA store of a swizzled shared-memory box to global memory (parts outside the
// tensor are clipped), tracked by the issuing thread's bulk groups (bulk_commit, bulk_wait).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0,
                                             int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
      ::"l"(map), "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA)
// reads of them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Barrier over `threads` threads (whole warps) with id `id` (0 is __syncthreads').
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at barrier `id` of `threads` threads without waiting (whole warps; the others of the
// count wait there with named_barrier_sync).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// Register budget per warpgroup: the TMA producer needs few, the MMA consumers need the
// 128-float accumulator tile plus addressing.
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace mok::sm90
