// The sm90 tile engine's weight-gradient pieces: dW[e] = A^T B reduced over an expert's rows
// (K = rows, both operands MN-major: gemm/sm90/tensor_map.h mn_major_rows_map), and the two
// ways its result leaves - bf16 through the staged epilogue (tile_epilogue.cuh, plain), or
// added into an fp32 gradient (Megatron's main_grad) in place.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/sm90/tma.cuh"

namespace mok::sm90 {

// Named barrier over both consumer warpgroups (ids below it: tile_epilogue.cuh's staging).
constexpr int kConsumersBarrier = kStagingBarrier + kGemmConsumers;

// An expert's rows rarely fill its last k-block: the K-rows past its end belong to the next
// expert or were never written (TMA zero-fills only past the tensor's edge, and 0 x NaN is
// NaN), so they are zeroed in both operands before the MMAs read them. Consumer c zeroes its
// A box and half of the B boxes, 16 bytes a thread per step (a whole 128-byte K-row keeps its
// bytes under the swizzle, which permutes chunks within a row), fences its generic writes
// for the async proxy, and both warpgroups meet before either issues an MMA.
template <int kBBoxes>
__device__ __forceinline__ void zero_k_tail(uint8_t* a, uint8_t* b, int valid, int consumer) {
  static_assert(kBBoxes % kGemmConsumers == 0, "B boxes split evenly between consumers");
  constexpr int kMine = 1 + kBBoxes / kGemmConsumers;  // boxes this warpgroup zeroes
  const int t = threadIdx.x % 128;
  const int chunks = (kGemmBlockK - valid) * 8;  // 16-byte chunks per box
  for (int idx = t; idx < kMine * chunks; idx += 128) {
    const int box = idx / chunks, rem = idx - box * chunks;
    uint8_t* base = box == 0 ? a + consumer * kMnBoxBytes
                             : b + (consumer * (kBBoxes / kGemmConsumers) + box - 1) * kMnBoxBytes;
    *reinterpret_cast<uint4*>(base + (valid + rem / 8) * 128 + (rem % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_shared();
  named_barrier_sync(kConsumersBarrier, 128 * kGemmConsumers);
}

// The stage hook (tile_engine.cuh: consume_tile) of a wgrad tile whose last k-block holds
// `last_rows` < kGemmBlockK valid rows (kGemmBlockK: nothing to zero).
template <int kBBoxes>
struct KTailZero {
  StageRing* ring;
  int k_blocks, last_rows, consumer;
  __device__ void operator()(int kb, int stage) const {
    if (kb == k_blocks - 1 && last_rows < kGemmBlockK) {
      zero_k_tail<kBBoxes>(ring->a[stage], ring->b[stage], last_rows, consumer);
    }
  }
};

// grad[m, n] += acc for this warpgroup's rows m = m0 + (16 warp + lane / 4 + 8 i) and columns
// n = n0 + 8 j + 2 (lane % 4) + {0, 1} inside [M, N) of a row-major fp32 [M, N] gradient. Each
// element is added exactly once per launch (one tile owns it), so the result is the same
// however the adds are ordered: one rounding of grad + acc. The adds are fire-and-forget
// vector reductions in L2 (the consumer does not wait for a read of main_grad).
__device__ __forceinline__ void accumulate_fp32(const float (&acc)[kAccRegs], float* grad,
                                                int m0, int n0, int rows, int cols) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int m = 16 * warp + lane / 4 + 8 * i;
    if (m >= rows) continue;
    float* row = grad + int64_t(m0 + m) * cols;
#pragma unroll
    for (int j = 0; j < kGemmBlockN / 8; ++j) {
      const int n = n0 + 8 * j + 2 * (lane % 4);
      if (n < cols) {
        atomicAdd(reinterpret_cast<float2*>(row + n),
                  make_float2(acc[4 * j + 2 * i], acc[4 * j + 2 * i + 1]));
      }
    }
  }
}

// A weight-gradient tile's fp32 accumulators between two parts of its reduction (the
// backward megakernel's expert parts: megakernel/backward_tiles.cuh), one consumer
// warpgroup's 64 rows as 128 threads x kAccRegs values: thread t's registers 4i .. 4i + 3 at
// float4 i * 128 + t, so each of the warpgroup's 16-byte accesses is one contiguous 2 KB.
constexpr int kCarryFloats = 128 * kAccRegs;

__device__ __forceinline__ void store_carry(const float (&acc)[kAccRegs], float* carry) {
  const int t = threadIdx.x % 128;
#pragma unroll
  for (int i = 0; i < kAccRegs / 4; ++i) {
    reinterpret_cast<float4*>(carry)[i * 128 + t] =
        make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
  }
}

// The values come into the accumulators through wgmma_fence-ordered plain register moves;
// consume_tile's first wgmma_fence orders them before the MMAs that read them.
__device__ __forceinline__ void load_carry(float (&acc)[kAccRegs], const float* carry) {
  const int t = threadIdx.x % 128;
#pragma unroll
  for (int i = 0; i < kAccRegs / 4; ++i) {
    const float4 v = reinterpret_cast<const float4*>(carry)[i * 128 + t];
    acc[4 * i] = v.x;
    acc[4 * i + 1] = v.y;
    acc[4 * i + 2] = v.z;
    acc[4 * i + 3] = v.w;
  }
}

}  // namespace mok::sm90
