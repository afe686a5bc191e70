// Grouped weight gradient added into fp32 gradients in place (Megatron's main_grad under
// gradient-accumulation fusion), for the separate backward:
//   grad[e] += A[rows of e]^T B[rows of e]   for every local expert e,
// A [rows, M] and B [rows, N] bf16 with contiguous rows, expert e owning rows offsets[e] ..
// offsets[e + 1] (a device-side prefix: the host never learns the counts), grad[e] a
// row-major fp32 [M, N] at the address grads[e]. dW2 = dY^T act (M = H, N = F) and
// dW1 = dh^T x (M = 2F, N = H), on every recipe: the FP8 recipes' wgrad operands are bf16
// rows holding their rounded values (operands.py).
//
// The backward megakernel's weight-gradient tiles, launched on their own: the sm90 tile
// engine with both operands MN-major (K = the expert's rows, gemm/sm90/wgrad.cuh), the rows
// past an expert's end zeroed in its last k-block, and each fp32 accumulator added into the
// gradient once (accumulate_fp32). Each element is added by exactly one tile, so the result is
// one rounding of grad + dW whatever the order: deterministic, the bits the megakernel adds.
//
// Schedule: tiles numbered (expert, m-block of M, n-block of N; n fastest); CTA b takes tiles
// b, b + grid, ... An expert without rows has no k-blocks and adds nothing.
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "gemm/persistent_launch.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/wgrad.cuh"
#include "gemm/timeout_report.h"
#include "ops.h"

namespace mok {
namespace {

using namespace sm90;

struct SharedStorage {
  StageRing ring;  // first: 1024-aligned, as TMA's 128-byte swizzle needs
  int32_t row_begin[kGemmMaxExperts + 1];
};
constexpr size_t kSharedBytes = aligned_smem_bytes<SharedStorage>();
static_assert(kSharedBytes <= kMaxDynamicSmemBytes, "shared memory of one block per SM");
constexpr int kABoxes = kGemmBlockM / 64;  // MN-major boxes of 64 columns per operand tile
constexpr int kBBoxes = kGemmBlockN / 64;

__global__ void __launch_bounds__(kGemmThreads, 1)
    grouped_wgrad_kernel(const __grid_constant__ CUtensorMap a_map,
                         const __grid_constant__ CUtensorMap b_map,
                         const int32_t* __restrict__ offsets, int num_experts, int m_dim,
                         int n_dim, const int64_t* __restrict__ grads, uint64_t timeout_ns,
                         int* report) {
  extern __shared__ uint8_t smem_raw[];
  SharedStorage& s = aligned_smem<SharedStorage>(smem_raw);

  const int warpgroup = threadIdx.x / 128;
  const int m_blocks = (m_dim + kGemmBlockM - 1) / kGemmBlockM;
  const int n_blocks = (n_dim + kGemmBlockN - 1) / kGemmBlockN;
  const int tiles_per_expert = m_blocks * n_blocks;
  const int num_tiles = num_experts * tiles_per_expert;

  for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) s.row_begin[e] = offsets[e];
  if (threadIdx.x == 0) init_ring(s.ring);
  __syncthreads();

  auto coord = [&](int tile) {
    const int e = tile / tiles_per_expert;
    const int in_expert = tile - e * tiles_per_expert;
    return TileCoord{e, in_expert / n_blocks, in_expert % n_blocks};
  };
  auto k_blocks_of = [&](int e) {
    return (s.row_begin[e + 1] - s.row_begin[e] + kGemmBlockK - 1) / kGemmBlockK;
  };

  if (warpgroup == 0) {
    // Producer: one thread streams the A and B boxes of each k-block through the stage ring.
    warpgroup_reg_dealloc<kGemmProducerRegs>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&b_map);
    int it = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const TileCoord tc = coord(tile);
      const int row0 = s.row_begin[tc.expert];
      produce_tile(s.ring, it, k_blocks_of(tc.expert), tile, timeout_ns, report,
                   [&](int stage, int k0) {
                     uint64_t* full = &s.ring.full[stage];
                     load_mn_boxes(s.ring.a[stage], &a_map, full, tc.m_block * kGemmBlockM,
                                   row0 + k0, 0, kABoxes);
                     load_mn_boxes(s.ring.b[stage], &b_map, full, tc.n_block * kGemmBlockN,
                                   row0 + k0, 0, kBBoxes);
                   });
    }
    return;
  }

  // Consumers: both warpgroups take every tile (zero_k_tail meets across them); warpgroup c
  // owns the gradient's rows 64c .. 64c + 63 of the tile.
  warpgroup_reg_alloc<kGemmConsumerRegs>();
  const int consumer = warpgroup - 1;
  const bool leader = threadIdx.x % 128 == 0;
  float acc[kAccRegs];
  int it = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord tc = coord(tile);
    const int k_blocks = k_blocks_of(tc.expert);
    if (k_blocks == 0) continue;  // no rows: dW = 0, the gradient keeps its bits
    const int rows = s.row_begin[tc.expert + 1] - s.row_begin[tc.expert];
    consume_tile<kGemmBlockN, true, true>(
        s.ring, it, k_blocks, tile, consumer, leader, acc, timeout_ns, report,
        KTailZero<kBBoxes>{&s.ring, k_blocks, rows - (k_blocks - 1) * kGemmBlockK, consumer});
    const int m0 = tc.m_block * kGemmBlockM + kGemmWarpgroupRows * consumer;
    const int rows_valid = max(0, min(kGemmWarpgroupRows, m_dim - m0));
    accumulate_fp32(acc, reinterpret_cast<float*>(grads[tc.expert]), m0,
                    tc.n_block * kGemmBlockN, rows_valid, n_dim);
  }
}

}  // namespace

void grouped_wgrad_accumulate(const at::Tensor& a, const at::Tensor& b,
                              const at::Tensor& offsets, const at::Tensor& grads, int64_t m_dim,
                              int64_t n_dim, int64_t timeout_ns, int64_t rank) {
  MOK_HOST_CHECK(a.is_cuda() && b.is_cuda() && offsets.is_cuda() && grads.is_cuda(),
                 "grouped_wgrad_accumulate: all tensors must be on the GPU");
  MOK_HOST_CHECK(a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16,
                 "grouped_wgrad_accumulate: A and B must be bf16");
  MOK_HOST_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(0) == b.size(0),
                 "grouped_wgrad_accumulate: A [rows, M] and B [rows, N] with the same rows");
  MOK_HOST_CHECK(a.size(1) == m_dim && b.size(1) == n_dim,
                 "grouped_wgrad_accumulate: A must have M = ", m_dim, " and B N = ", n_dim,
                 " columns");
  MOK_HOST_CHECK(a.stride(1) == 1 && b.stride(1) == 1 && a.stride(0) % 8 == 0 &&
                     b.stride(0) % 8 == 0,
                 "grouped_wgrad_accumulate: A and B need contiguous rows with strides of "
                 "16 bytes");
  MOK_HOST_CHECK(m_dim % 8 == 0 && n_dim % 8 == 0,
                 "grouped_wgrad_accumulate: M and N must be multiples of 8");
  MOK_HOST_CHECK(offsets.scalar_type() == at::kInt && offsets.dim() == 1 &&
                     offsets.is_contiguous(),
                 "grouped_wgrad_accumulate: offsets must be a contiguous int32 vector");
  MOK_HOST_CHECK(grads.scalar_type() == at::kLong && grads.dim() == 1 &&
                     grads.is_contiguous() && grads.numel() + 1 == offsets.numel(),
                 "grouped_wgrad_accumulate: grads must be an int64 address per expert (",
                 offsets.numel() - 1, "), got ", grads.numel());
  const int64_t num_experts = grads.numel();
  MOK_HOST_CHECK(num_experts >= 1 && num_experts <= kGemmMaxExperts,
                 "grouped_wgrad_accumulate: 1..", kGemmMaxExperts, " experts, got ",
                 num_experts);
  if (a.size(0) == 0) return;
  c10::cuda::CUDAGuard guard(a.device());
  const CUtensorMap a_map = sm90::mn_major_rows_map(a.data_ptr(), a.size(0), m_dim, a.stride(0));
  const CUtensorMap b_map = sm90::mn_major_rows_map(b.data_ptr(), b.size(0), n_dim, b.stride(0));
  launch_persistent(grouped_wgrad_kernel, kSharedBytes, a_map, b_map,
                    offsets.data_ptr<int32_t>(), static_cast<int>(num_experts),
                    static_cast<int>(m_dim), static_cast<int>(n_dim),
                    grads.data_ptr<int64_t>(), static_cast<uint64_t>(timeout_ns),
                    timeout_report_device(kReportGroupedGemm, rank, timeout_ns));
}

}  // namespace mok
