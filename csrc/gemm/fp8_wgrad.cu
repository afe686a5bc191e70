// FP8 weight gradients under the blockwise recipe: dW[e] = Qn(A_e)^T Qn(B_e) for every local
// expert in one persistent launch, E4M3 tensor-core MMAs. A_e, B_e are expert e's rows of the
// schedule (dY and act for dW2 [E, H, F], dh and the token rows for dW1 [E, F1, H]), each
// quantized 128 x 1 along the rows from the expert's first row, so K is the expert's rows.
// FP8 MMAs read K-major operands only: both arrive transposed from
// quant/segment_quantize.cu - codes [cols, K_pad] with expert e's rows at k-blocks
// block_offsets[e] .. block_offsets[e + 1] (its last block zero-padded), E8M0 scales
// [k-blocks, cols] for A (row scales) and bf16 in fragment order for B (column scales,
// ColumnScaleLayout). A tile is 128 rows of dW[e] x 128 columns over the expert's k-blocks
// (gemm/sm90/fp8_wgrad_consumer.cuh); an expert without rows gets zeros. Each element is
// computed by one tile in a fixed K order: deterministic.
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "gemm/persistent_launch.cuh"
#include "gemm/sm90/fp8_mainloop.cuh"
#include "gemm/sm90/fp8_wgrad_consumer.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/timeout_report.h"
#include "ops.h"

namespace mok {
namespace {

using namespace sm90;

constexpr int kWgradStagedBytes = (kFp8BlockN / 64) * kStagedBoxBytes;

struct Fp8WgradSharedStorage {
  uint8_t staged[kGemmConsumers][kWgradStagedBytes];  // first: 1024-aligned for TMA
  Fp8StageRing<Fp8SegmentScales> ring;
  int32_t block_begin[kGemmMaxExperts + 1];
};
constexpr size_t kFp8WgradSharedBytes = aligned_smem_bytes<Fp8WgradSharedStorage>();
static_assert(kFp8WgradSharedBytes <= kMaxDynamicSmemBytes, "shared memory of one block per SM");

// Tile t of E x m_blocks x n_blocks, expert-major (an expert's operands stay in L2).
struct WgradTile {
  int expert, m0, n0;
  __device__ WgradTile(int t, int m_blocks, int n_blocks) {
    const int per_expert = m_blocks * n_blocks;
    expert = t / per_expert;
    const int rem = t - expert * per_expert;
    m0 = (rem / n_blocks) * kGemmBlockM;
    n0 = (rem % n_blocks) * kFp8BlockN;
  }
};

__global__ void __launch_bounds__(kGemmThreads, 1)
    fp8_wgrad_kernel(const __grid_constant__ CUtensorMap a_map,
                     const __grid_constant__ CUtensorMap a_scales_map,
                     const __grid_constant__ CUtensorMap b_map,
                     const __grid_constant__ CUtensorMap b_scales_map,
                     const __grid_constant__ CUtensorMap out_map,
                     const int32_t* __restrict__ block_offsets, int num_experts, int m, int n,
                     __nv_bfloat16* __restrict__ out, int64_t out_stride, uint64_t timeout_ns,
                     int* report) {
  extern __shared__ uint8_t smem_raw[];
  Fp8WgradSharedStorage& s = aligned_smem<Fp8WgradSharedStorage>(smem_raw);
  const int warpgroup = threadIdx.x / 128;
  const int m_blocks = (m + kGemmBlockM - 1) / kGemmBlockM;
  const int n_blocks = (n + kFp8BlockN - 1) / kFp8BlockN;
  const int num_tiles = num_experts * m_blocks * n_blocks;
  for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) s.block_begin[e] = block_offsets[e];
  if (threadIdx.x == 0) init_fp8_ring(s.ring);
  __syncthreads();

  if (warpgroup == 0) {
    warpgroup_reg_dealloc<kGemmProducerRegs>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&a_scales_map);
    prefetch_tensor_map(&b_map);
    prefetch_tensor_map(&b_scales_map);
    int it = 0;
    for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
      const WgradTile tile(t, m_blocks, n_blocks);
      const int kb0 = s.block_begin[tile.expert];
      produce_fp8_tile<Fp8SegmentScales, false>(
          s.ring, it, s.block_begin[tile.expert + 1] - kb0, t, &a_map, &a_scales_map, &b_map,
          &b_scales_map, tile.m0, tile.n0, 0, timeout_ns, report, kb0);
    }
    return;
  }

  // Consumers: warpgroup c owns rows 64(c-1) .. 64c of every tile.
  warpgroup_reg_alloc<kGemmConsumerRegs>();
  const int consumer = warpgroup - 1;
  const bool leader = threadIdx.x % 128 == 0;
  const float p[2] = {1.f, 1.f};
  float acc[kFp8AccRegs];
  int it = 0;
  for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const WgradTile tile(t, m_blocks, n_blocks);
    const int k_blocks = s.block_begin[tile.expert + 1] - s.block_begin[tile.expert];
    const int rows_left = m - tile.m0;
    const int rows_valid = max(0, min(kStagedRows, rows_left - kStagedRows * consumer));
    if (rows_valid == 0) {
      pass_fp8_tile(s.ring, it, k_blocks, t, leader, kStagingBarrier + consumer, timeout_ns,
                    report);
      continue;
    }
    consume_fp8_wgrad_tile(s.ring, it, k_blocks, t, consumer, tile.m0, acc, timeout_ns, report);
    const int out_row0 = tile.expert * m + tile.m0 + kStagedRows * consumer;
    store_rows_staged<kPlain, kFp8BlockN>(acc, s.staged[consumer],
                                          EpilogueTensor{&out_map, out, out_stride},
                                          EpilogueTensor{nullptr, nullptr, 0}, out_row0,
                                          rows_left >= kStagedRows * (consumer + 1), rows_valid,
                                          tile.n0, n, p, consumer, leader);
  }
  if (leader) bulk_wait_read<0>();  // the last stores have read shared memory before exit
}

// A transposed operand's codes [cols, K_pad] (rows 16-byte aligned, K_pad whole blocks).
void check_codes_t(const at::Tensor& codes, const char* name, int64_t k_pad) {
  MOK_HOST_CHECK(codes.is_cuda() && codes.scalar_type() == at::kFloat8_e4m3fn &&
                     codes.dim() == 2 && codes.stride(1) == 1 && codes.stride(0) % 16 == 0 &&
                     codes.size(1) == k_pad && k_pad % kFp8BlockK == 0 &&
                     reinterpret_cast<uintptr_t>(codes.data_ptr()) % 16 == 0,
                 "fp8_wgrad: ", name, " must be float8_e4m3fn codes [cols, ", k_pad,
                 "] (whole 128-row blocks, rows 16-byte aligned), got ", codes.sizes());
}

}  // namespace

void fp8_wgrad(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
               const at::Tensor& b_scales, const at::Tensor& block_offsets, at::Tensor& out,
               int64_t timeout_ns, int64_t rank) {
  const char* what = "fp8_wgrad";
  const int64_t k_pad = a.size(1), k_blocks = k_pad / kFp8BlockK;
  check_codes_t(a, "a", k_pad);
  check_codes_t(b, "b", k_pad);
  MOK_HOST_CHECK(block_offsets.is_cuda() && block_offsets.scalar_type() == at::kInt &&
                     block_offsets.dim() == 1 && block_offsets.is_contiguous() &&
                     block_offsets.numel() >= 2 && block_offsets.numel() - 1 <= kGemmMaxExperts,
                 what, ": block_offsets must be int32 [E + 1] on the GPU, 1 <= E <= ",
                 kGemmMaxExperts);
  const int64_t num_experts = block_offsets.numel() - 1, m = a.size(0), n = b.size(0);
  const int64_t padded_n = (n + kFp8BlockN - 1) / kFp8BlockN * kFp8BlockN;
  MOK_HOST_CHECK(a_scales.device() == a.device() && a_scales.scalar_type() == at::kByte &&
                     a_scales.dim() == 2 && a_scales.size(0) == k_blocks &&
                     a_scales.size(1) >= m && a_scales.stride(1) == 1 &&
                     a_scales.stride(0) % 16 == 0,
                 what, ": a_scales must be uint8 E8M0 [", k_blocks, ", >= ", m,
                 "] with rows padded to 16, got ", a_scales.sizes());
  MOK_HOST_CHECK(b_scales.device() == b.device() && b_scales.scalar_type() == at::kBFloat16 &&
                     b_scales.is_contiguous() && b_scales.dim() == 4 && b_scales.size(0) == 1 &&
                     b_scales.size(1) == k_blocks && b_scales.size(2) == 1 &&
                     b_scales.size(3) == padded_n,
                 what, ": b_scales must be contiguous bf16 column scales in fragment order [1, ",
                 k_blocks, ", 1, ", padded_n, "], got ", b_scales.sizes());
  MOK_HOST_CHECK(out.is_cuda() && out.scalar_type() == at::kBFloat16 && out.dim() == 3 &&
                     out.size(0) == num_experts && out.size(1) == m && out.size(2) == n &&
                     out.is_contiguous() && n % 8 == 0,
                 what, ": out must be contiguous bf16 [", num_experts, ", ", m, ", ", n,
                 "] with N a multiple of 8, got ", out.sizes());
  if (out.numel() == 0) return;
  c10::cuda::CUDAGuard guard(a.device());
  const CUtensorMap a_map = sm90::fp8_row_tile_map(a.data_ptr(), m, k_pad, a.stride(0));
  // One scale block per stage (the ring's transaction bytes count boxes of this size).
  constexpr int kBlocksPerStage = sm90::Fp8StageRing<sm90::Fp8SegmentScales>::kScaleBlocks;
  const CUtensorMap a_scales_map = sm90::fp8_row_scales_map(a_scales.data_ptr(), k_blocks, m,
                                                            a_scales.stride(0), kBlocksPerStage);
  const CUtensorMap b_map =
      sm90::fp8_expert_weight_map(b.data_ptr(), 1, n, k_pad, n * b.stride(0), b.stride(0), 1);
  const CUtensorMap b_scales_map =
      sm90::fp8_column_scales_map(b_scales.data_ptr(), 1, k_blocks, 1, padded_n, kBlocksPerStage);
  const CUtensorMap out_map =
      sm90::staged_rows_map(out.data_ptr(), num_experts * m, n, 1, n);
  launch_persistent(fp8_wgrad_kernel, kFp8WgradSharedBytes, a_map, a_scales_map, b_map,
                    b_scales_map, out_map, block_offsets.data_ptr<int32_t>(),
                    static_cast<int>(num_experts), static_cast<int>(m), static_cast<int>(n),
                    reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), n,
                    static_cast<uint64_t>(timeout_ns),
                    timeout_report_device(kReportGroupedGemm, rank, timeout_ns));
}

}  // namespace mok
