// Grouped GEMM tile engine: out[rows of expert e] = epilogue(A[rows of e] @ W[e]^T), for all
// local experts in one persistent launch. A is [rows, K] (rows grouped by expert, expert e
// owning rows offsets[e] .. offsets[e+1], a device-side prefix), W is [E, N, K] (Megatron's
// FC1 [2F, H] / FC2 [H, F] per expert): both operands K-major, so both go through TMA with
// 128-byte swizzle straight into the layout wgmma reads.
//
// W may instead be MXFP8 (E4M3 codes [E, N, K] with E8M0 scales per kMxBlock of K): TMA then
// moves one byte per weight and the consumers dequantize each stage in shared memory to the
// bf16 values wgmma multiplies (gemm/sm90/mx_weight_stage.cuh) - the same products, bit for
// bit, as this engine on the weights mx_round_columns rounds.
//
// The epilogue (plain for FC2; activation x prob for FC1, with the bf16 pre-activation h for
// backward when h_out is given) and its staged TMA store: gemm/sm90/tile_epilogue.cuh.
//
// Schedule: tiles are numbered expert-major from the device-side offsets, so the host never
// learns the row counts, each expert's m-blocks in groups of m_group taken n-block by n-block
// (sm90::decode_grouped_tile; kEngineTileGroupMBlocks unless the call says): the tiles that
// read one weight slab run in the same wave. CTA b takes tiles b, b + grid, ...
// Each output element is computed by exactly one tile in a fixed K order: deterministic.
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "gemm/mx_weight_checks.h"
#include "gemm/persistent_launch.cuh"
#include "gemm/sm90/mx_weight_stage.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/timeout_report.h"
#include "ops.h"

namespace mok {
namespace {

using namespace sm90;

struct SharedStorage {
  EpilogueBuffers epilogue;  // first: 1024-aligned, as TMA's 128-byte swizzle needs
  StageRing ring;
  MxScaleRing mx_scales;  // MXFP8 weights only
  int32_t row_begin[kGemmMaxExperts + 1];
  int32_t mblock_begin[kGemmMaxExperts + 1];
};
constexpr size_t kSharedBytes = aligned_smem_bytes<SharedStorage>();
static_assert(kSharedBytes <= kMaxDynamicSmemBytes, "shared memory of one block per SM");

template <int kAct, bool kMx>
__global__ void __launch_bounds__(kGemmThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap w_map,
                        const __grid_constant__ CUtensorMap w_scales_map,
                        const __grid_constant__ CUtensorMap out_map,
                        const __grid_constant__ CUtensorMap h_map,
                        const int32_t* __restrict__ offsets, int num_experts, int n_out,
                        int k_dim, const float* __restrict__ row_prob,
                        __nv_bfloat16* __restrict__ out, int64_t out_stride,
                        __nv_bfloat16* __restrict__ h_out, int64_t h_stride, int m_group,
                        uint64_t timeout_ns, int* report) {
  constexpr bool kGated = gated_epilogue<kAct>();
  constexpr int kTileN = tile_cols<kAct>();
  extern __shared__ uint8_t smem_raw[];
  SharedStorage& s = aligned_smem<SharedStorage>(smem_raw);

  const int warpgroup = threadIdx.x / 128;
  const int n_blocks = (n_out + kTileN - 1) / kTileN;
  const int k_blocks = (k_dim + kGemmBlockK - 1) / kGemmBlockK;

  if (threadIdx.x < 32) {
    build_mblock_table(offsets, num_experts, s.row_begin, s.mblock_begin);
  }
  if (threadIdx.x == 32) init_ring(s.ring);
  __syncthreads();
  const int num_tiles = s.mblock_begin[num_experts] * n_blocks;

  if (warpgroup == 0) {
    // Producer: one thread streams A and W tiles through the stage ring.
    warpgroup_reg_dealloc<kGemmProducerRegs>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&w_map);
    int it = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const TileCoord tc =
          decode_grouped_tile(s.mblock_begin, num_experts, n_blocks, tile, m_group);
      const int row0 = s.row_begin[tc.expert] + tc.m_block * kGemmBlockM;
      const int n0 = tc.n_block * kTileN;
      constexpr uint32_t kBytes = kMx ? kMxStageTxBytes : kStageBytes;
      produce_tile(s.ring, it, k_blocks, tile, timeout_ns, report, [&](int stage, int k0) {
        uint64_t* full = &s.ring.full[stage];
        tma_load_4d(s.ring.a[stage], &a_map, full, k0, row0, 0, 0);
        if constexpr (kMx) {
          load_weight_codes<kGated>(s.ring.b[stage], s.mx_scales.codes[stage], &w_map,
                                    &w_scales_map, full, k0, n0, tc.expert);
        }
        else load_weight_tile<kGated>(s.ring.b[stage], &w_map, full, k0, n0, tc.expert);
      }, kBytes);
    }
    return;
  }

  // Consumers: warpgroup c owns rows 64(c-1) .. 64c of every tile.
  warpgroup_reg_alloc<kGemmConsumerRegs>();
  const int consumer = warpgroup - 1;
  const bool leader = threadIdx.x % 128 == 0;
  float acc[kAccRegs];
  const MxWeightStage<kGated> mx;
  int it = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord tc =
        decode_grouped_tile(s.mblock_begin, num_experts, n_blocks, tile, m_group);
    const int m_row0 = tc.m_block * kGemmBlockM;
    const int rows_left = s.row_begin[tc.expert + 1] - s.row_begin[tc.expert] - m_row0;
    const int rows_valid = max(0, min(kStagedRows, rows_left - kStagedRows * consumer));
    const int row0 = s.row_begin[tc.expert] + m_row0 + kStagedRows * consumer;
    float p[2];
    load_row_probs<kAct>(row_prob, row0, rows_valid, p);
    // A tile of at most 64 rows is the first warpgroup's alone (tile_engine.cuh: pass_tile).
    if (rows_valid == 0) {
      if constexpr (kMx) {
        convert_only_tile(s.ring, s.mx_scales, it, k_blocks, tile, leader, mx, timeout_ns,
                          report);
      } else {
        pass_tile(s.ring, it, k_blocks, tile, leader, kStagingBarrier + consumer, timeout_ns,
                  report);
      }
      continue;
    }
    if constexpr (kMx) {
      consume_tile(s.ring, it, k_blocks, tile, consumer, leader, acc, timeout_ns, report,
                   [&](int, int stage) { mx.convert(s.ring.b[stage], s.mx_scales.codes[stage]); });
    } else {
      consume_tile(s.ring, it, k_blocks, tile, consumer, leader, acc, timeout_ns, report);
    }
    store_rows_staged<kAct>(acc, s.epilogue.out[consumer],
                            EpilogueTensor{&out_map, out, out_stride},
                            EpilogueTensor{&h_map, h_out, h_stride}, row0,
                            rows_left >= kStagedRows * (consumer + 1), rows_valid,
                            tc.n_block * kTileN, n_out, p, consumer, leader);
  }
  if (leader) bulk_wait_read<0>();  // the last stores have read shared memory before exit
}

template <int kAct>
void launch(const CUtensorMap& a_map, const CUtensorMap& w_map,
            const CUtensorMap* w_scales_map, const CUtensorMap& out_map,
            const CUtensorMap& h_map, const at::Tensor& offsets, int num_experts, int n_out,
            int k_dim, const float* row_prob, at::Tensor& out, __nv_bfloat16* h_out,
            int64_t h_stride, int m_group, int64_t timeout_ns, int64_t rank) {
  auto run = [&](auto kernel, const CUtensorMap& scales_map) {
    launch_persistent(kernel, kSharedBytes, a_map, w_map, scales_map, out_map, h_map,
                      offsets.data_ptr<int32_t>(), num_experts, n_out, k_dim, row_prob,
                      reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), out.stride(0), h_out,
                      h_stride, m_group, static_cast<uint64_t>(timeout_ns),
                      timeout_report_device(kReportGroupedGemm, rank, timeout_ns));
  };
  if (w_scales_map != nullptr) run(grouped_gemm_kernel<kAct, true>, *w_scales_map);
  else run(grouped_gemm_kernel<kAct, false>, CUtensorMap{});
}

}  // namespace

void grouped_gemm(const at::Tensor& a, const at::Tensor& w, const at::Tensor& offsets,
                  const c10::optional<at::Tensor>& row_prob, int64_t activation, at::Tensor& out,
                  const c10::optional<at::Tensor>& h_out,
                  const c10::optional<at::Tensor>& w_scales, int64_t timeout_ns, int64_t rank,
                  int64_t m_group) {
  MOK_HOST_CHECK(a.is_cuda() && w.is_cuda() && offsets.is_cuda() && out.is_cuda(),
                 "grouped_gemm: all tensors must be on the GPU");
  const bool mx = w_scales.has_value();
  MOK_HOST_CHECK(a.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16 &&
                     w.scalar_type() == (mx ? at::kFloat8_e4m3fn : at::kBFloat16),
                 "grouped_gemm: A and out must be bf16, W bf16 or (with w_scales) "
                 "float8_e4m3fn codes");
  MOK_HOST_CHECK(offsets.scalar_type() == at::kInt && offsets.dim() == 1 &&
                     offsets.is_contiguous(),
                 "grouped_gemm: offsets must be a contiguous int32 vector");
  MOK_HOST_CHECK(a.dim() == 2 && w.dim() == 3 && out.dim() == 2,
                 "grouped_gemm: A [rows, K], W [E, N, K], out [rows, N_out]");
  const int64_t num_experts = w.size(0);
  const int64_t k_dim = a.size(1);
  MOK_HOST_CHECK(offsets.numel() == num_experts + 1, "grouped_gemm: offsets needs E + 1 = ",
                 num_experts + 1, " entries, got ", offsets.numel());
  MOK_HOST_CHECK(num_experts >= 1 && num_experts <= kGemmMaxExperts,
                 "grouped_gemm: 1..", kGemmMaxExperts, " experts per launch, got ", num_experts);
  MOK_HOST_CHECK(w.size(2) == k_dim, "grouped_gemm: W's K (", w.size(2), ") != A's K (",
                 k_dim, ")");
  MOK_HOST_CHECK(k_dim % 8 == 0, "grouped_gemm: K must be a multiple of 8 (16-byte rows)");
  MOK_HOST_CHECK(a.stride(1) == 1 && w.stride(2) == 1 && out.stride(1) == 1,
                 "grouped_gemm: rows of A, W and out must be contiguous");
  MOK_HOST_CHECK(w.stride(0) > 0 && w.stride(1) > 0,
                 "grouped_gemm: W needs positive expert and row strides (stack it)");
  const bool gated = activation != kPlain && is_gated(static_cast<int>(activation));
  const int64_t n_out = gated ? w.size(1) / 2 : w.size(1);
  MOK_HOST_CHECK(!gated || w.size(1) % 2 == 0, "grouped_gemm: gated W needs an even N");
  MOK_HOST_CHECK(n_out % 8 == 0, "grouped_gemm: N_out must be a multiple of 8");
  const int halves = gated ? 2 : 1;
  if (mx) check_mx_weight("grouped_gemm", w, *w_scales, halves);
  MOK_HOST_CHECK(out.size(0) >= a.size(0) && out.size(1) == n_out,
                 "grouped_gemm: out must be [>= rows, ", n_out, "]");
  MOK_HOST_CHECK(activation == kPlain || (row_prob && row_prob->is_cuda() &&
                                          row_prob->scalar_type() == at::kFloat &&
                                          row_prob->is_contiguous() &&
                                          row_prob->numel() >= a.size(0)),
                 "grouped_gemm: an activation epilogue needs row_prob (fp32, one per row)");
  __nv_bfloat16* h_ptr = nullptr;
  int64_t h_stride = 0;
  if (h_out) {
    MOK_HOST_CHECK(activation != kPlain, "grouped_gemm: h_out only with an activation");
    MOK_HOST_CHECK(h_out->is_cuda() && h_out->scalar_type() == at::kBFloat16 &&
                       h_out->dim() == 2 && h_out->stride(1) == 1 &&
                       h_out->size(0) >= a.size(0) && h_out->size(1) == w.size(1),
                   "grouped_gemm: h_out must be bf16 [>= rows, N] with contiguous rows");
    h_ptr = reinterpret_cast<__nv_bfloat16*>(h_out->data_ptr());
    h_stride = h_out->stride(0);
  }
  MOK_HOST_CHECK(m_group >= 0 && m_group <= 65536, "grouped_gemm: m_group must be 0 (the "
                 "default, ", kEngineTileGroupMBlocks, ") or 1..65536 m-blocks, got ", m_group);
  if (a.size(0) == 0) return;
  c10::cuda::CUDAGuard guard(a.device());

  const CUtensorMap a_map =
      sm90::row_tile_map(a.data_ptr(), a.size(0), k_dim, a.stride(0));
  const CUtensorMap w_map =
      mx ? sm90::expert_weight_codes_map(w.data_ptr(), num_experts, w.size(1), k_dim,
                                         w.stride(0), w.stride(1), halves)
         : sm90::expert_weight_map(w.data_ptr(), num_experts, w.size(1), k_dim, w.stride(0),
                                   w.stride(1), halves);
  const CUtensorMap scales_map =
      mx ? sm90::expert_weight_scales_map(w_scales->data_ptr(), num_experts, w_scales->size(1),
                                          halves, w.size(1) / halves, w_scales->size(3))
         : CUtensorMap{};
  MOK_HOST_CHECK(out.stride(0) % 8 == 0 && h_stride % 8 == 0,
                 "grouped_gemm: out and h_out row strides must be multiples of 8 elements "
                 "(16 bytes, for TMA stores)");
  const CUtensorMap out_map = sm90::staged_rows_map(out.data_ptr(), out.size(0), n_out, 1,
                                                    out.stride(0));
  const CUtensorMap h_map =
      h_out ? sm90::staged_rows_map(h_ptr, h_out->size(0), n_out, gated ? 2 : 1, h_stride)
            : CUtensorMap{};
  const float* prob = activation == kPlain ? nullptr : row_prob->data_ptr<float>();
  const int e = static_cast<int>(num_experts), n = static_cast<int>(n_out),
            k = static_cast<int>(k_dim),
            group = m_group == 0 ? kEngineTileGroupMBlocks : static_cast<int>(m_group);
  if (activation == kPlain) {
    launch<kPlain>(a_map, w_map, mx ? &scales_map : nullptr, out_map, h_map, offsets, e, n, k,
                   prob, out, h_ptr, h_stride, group, timeout_ns, rank);
  } else {
    MOK_DISPATCH_ACTIVATION(activation, KACT,
        launch<KACT>(a_map, w_map, mx ? &scales_map : nullptr, out_map, h_map, offsets, e, n,
                     k, prob, out, h_ptr, h_stride, group, timeout_ns, rank));
  }
}

}  // namespace mok
