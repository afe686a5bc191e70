// FP8 grouped GEMM: out[rows of expert e] = epilogue(deq(A)[rows of e] @ deq(W[e])^T), all
// local experts in one persistent launch, E4M3 tensor-core MMAs. A: E4M3 codes [rows, K] with
// E8M0 scale codes per 1 x 128 of each row, stored transposed [ceil(K / 128), rows padded to
// 16] so a stage's rows are one TMA box; W: E4M3 codes [E, N, K] with E8M0 codes per 128 x 128
// block [E, ceil(N / 128), ceil(K / 128)] - the blockwise recipe. The products of the
// dequantized values are summed in fp32: per scale block of K by the tensor cores, across
// blocks on the CUDA cores (gemm/sm90/fp8_mainloop.cuh).
//
// Tiles, schedule and epilogue are the bf16 engine's (grouped_gemm.cu) with kFp8BlockN
// columns: tiles expert-major from the device-side offsets, each output element computed by
// one tile in a fixed K order (deterministic); FC1's activation x prob and h for backward in
// the epilogue (gemm/sm90/tile_epilogue.cuh). Four options change when and where tiles and
// stages run, never the bits: the ring's depth (kStages), the tile order's m-block groups
// (m_group), CTA pairs (kCtas = 2: clusters of two CTAs whose tiles are adjacent m-blocks of
// one n-block share the weight tile's L2 reads by TMA multicast, as cuBLAS's blockwise kernel's
// 2 x 1 clusters do) and 192-column tiles (kFp8WideBlockN: 1.5x the MMAs per k-block over the
// same per-block promotion chain, 4 stages; a tile's weight rows span two scale blocks, a
// gated tile's 96 gate and 96 up rows two each, and its 96 output columns leave as 32-column
// boxes: tile_epilogue.cuh, StagedBox).
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "gemm/persistent_launch.cuh"
#include "gemm/sm90/fp8_mainloop.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/timeout_report.h"
#include "ops.h"

namespace mok {
namespace {

using namespace sm90;

// Followed by the launch's expert tables, row_begin and mblock_begin [E + 1] each, sized at
// launch (fp8_smem_bytes) so that the deepest ring fits at small expert counts. A consumer's
// staging buffer holds kTileN bf16 columns of its 64 rows (swizzled boxes).
template <int kStages, int kTileN = kFp8BlockN>
struct Fp8SharedStorage {
  uint8_t staged[kGemmConsumers][(kTileN / 64) * kStagedBoxBytes];  // first: 1024-aligned
  Fp8StageRing<Fp8BlockScales, kStages, kTileN> ring;
};

template <int kStages, int kTileN = kFp8BlockN>
constexpr size_t fp8_smem_bytes(int64_t num_experts) {
  return aligned_smem_bytes<Fp8SharedStorage<kStages, kTileN>>() +
         2 * (num_experts + 1) * sizeof(int32_t);
}
static_assert(fp8_smem_bytes<kFp8MinStages>(kGemmMaxExperts) <= kMaxDynamicSmemBytes,
              "the shallowest ring fits with every expert count a launch takes");
static_assert(fp8_smem_bytes<kFp8MaxStages>(32) <= kMaxDynamicSmemBytes,
              "the deepest ring fits at the expert counts of an EP group's ranks (up to 32)");
static_assert(fp8_smem_bytes<kFp8WideStages, kFp8WideBlockN>(kGemmMaxExperts) <=
                      kMaxDynamicSmemBytes &&
                  fp8_smem_bytes<kFp8WideStages + 1, kFp8WideBlockN>(0) > kMaxDynamicSmemBytes,
              "the wide tiles' ring is the deepest that fits, with every expert count");

// This CTA's tile of unit u of the walk: the tile u itself (kCtas = 1), or tile 2u + rank of
// pair u - adjacent in the grouped order, so mostly the same n-block of one expert's adjacent
// m-blocks; a rank 1 past the last tile shadows its peer's (loads for the multicast, computes
// nothing) - and whether both CTAs' tiles read the same weight rows.
struct OwnTile {
  TileCoord tc;
  int tile;
  bool shadow, shared_b;
};

template <int kCtas>
__device__ __forceinline__ OwnTile own_tile(const int32_t* mblock_begin, int num_experts,
                                            int n_blocks, int num_tiles, int m_group, int u,
                                            uint32_t rank) {
  if constexpr (kCtas == 1) {
    return {decode_grouped_tile(mblock_begin, num_experts, n_blocks, u, m_group), u, false,
            false};
  } else {
    const int mine = 2 * u + static_cast<int>(rank), peer = 2 * u + static_cast<int>(rank ^ 1);
    const int t = mine < num_tiles ? mine : 2 * u;
    const TileCoord a = decode_grouped_tile(mblock_begin, num_experts, n_blocks, t, m_group);
    const TileCoord b = decode_grouped_tile(mblock_begin, num_experts, n_blocks,
                                            peer < num_tiles ? peer : 2 * u, m_group);
    return {a, t, mine >= num_tiles, a.expert == b.expert && a.n_block == b.n_block};
  }
}

template <int kAct, int kStages, int kCtas, int kTileCols>
__global__ void __launch_bounds__(kGemmThreads, 1)
    fp8_grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                            const __grid_constant__ CUtensorMap a_scales_map,
                            const __grid_constant__ CUtensorMap w_map,
                            const __grid_constant__ CUtensorMap out_map,
                            const __grid_constant__ CUtensorMap h_map, Fp8Weights w,
                            const int32_t* __restrict__ offsets, int num_experts, int m_group,
                            int n_out, int k_dim, const float* __restrict__ row_prob,
                            __nv_bfloat16* __restrict__ out, int64_t out_stride,
                            __nv_bfloat16* __restrict__ h_out, int64_t h_stride,
                            uint64_t timeout_ns, int* report) {
  constexpr bool kGated = gated_epilogue<kAct>();
  constexpr int kTileN = tile_cols<kAct, kTileCols>();
  extern __shared__ uint8_t smem_raw[];
  using Storage = Fp8SharedStorage<kStages, kTileCols>;
  Storage& s = aligned_smem<Storage>(smem_raw);
  int32_t* row_begin = reinterpret_cast<int32_t*>(&s + 1);
  int32_t* mblock_begin = row_begin + num_experts + 1;

  const int warpgroup = threadIdx.x / 128;
  const int n_blocks = (n_out + kTileN - 1) / kTileN;
  const int k_blocks = (k_dim + kFp8BlockK - 1) / kFp8BlockK;

  const uint32_t rank = kCtas == 1 ? 0 : cluster_ctarank();

  if (threadIdx.x < 32) build_mblock_table(offsets, num_experts, row_begin, mblock_begin);
  if (threadIdx.x == 32) init_fp8_ring<kCtas>(s.ring);
  // A pair's barriers are initialised in both CTAs before either multicasts or arrives there.
  if constexpr (kCtas == 1) {
    __syncthreads();
  } else {
    cluster_sync();
  }
  const int num_tiles = mblock_begin[num_experts] * n_blocks;
  const int units = (num_tiles + kCtas - 1) / kCtas;  // tiles, or tile pairs
  const int first_unit = blockIdx.x / kCtas, unit_stride = gridDim.x / kCtas;

  if (warpgroup == 0) {
    // Producer: one thread streams A, its scales, W and its blocks' scales (decoded per 32
    // weight rows) through the stage ring.
    warpgroup_reg_dealloc<kGemmProducerRegs>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&a_scales_map);
    prefetch_tensor_map(&w_map);
    int it = 0;
    for (int u = first_unit; u < units; u += unit_stride) {
      const OwnTile o =
          own_tile<kCtas>(mblock_begin, num_experts, n_blocks, num_tiles, m_group, u, rank);
      const int row0 = row_begin[o.tc.expert] + o.tc.m_block * kGemmBlockM;
      const int n0 = o.tc.n_block * kTileN;
      if constexpr (kCtas == 1) {
        produce_fp8_tile<kGated>(s.ring, it, k_blocks, o.tile, &a_map, &a_scales_map, &w_map, w,
                                 row0, n0, o.tc.expert, timeout_ns, report);
      } else {
        produce_fp8_tile_pair<kGated>(s.ring, it, k_blocks, o.tile, &a_map, &a_scales_map,
                                      &w_map, w, row0, n0, o.tc.expert, rank, o.shared_b,
                                      timeout_ns, report);
      }
    }
    // Pairs: no arrive of the peer's is in flight at exit. Wide tiles: their consumers wait
    // unbounded, so this bounded wait for every stage's release reports a stalled consumer.
    if constexpr (kCtas == 2 || kTileCols == kFp8WideBlockN) {
      drain_fp8_ring(s.ring, it, timeout_ns, report);
    }
    return;
  }

  // Consumers: warpgroup c owns rows 64(c-1) .. 64c of every tile.
  warpgroup_reg_alloc<kGemmConsumerRegs>();
  // Broadcast from lane 0: ptxas then knows it is warp-uniform and builds part of the MMAs'
  // shared-memory descriptors with uniform-datapath instructions.
  const int consumer = __shfl_sync(0xffffffffu, warpgroup - 1, 0);
  const bool leader = threadIdx.x % 128 == 0;
  float acc[kTileCols / 2];
  int it = 0;
  const auto release = [&] {
    if constexpr (kCtas == 1) {
      return LocalRelease{};
    } else {
      return PairRelease{rank ^ 1};
    }
  }();
  for (int u = first_unit; u < units; u += unit_stride) {
    const OwnTile o =
        own_tile<kCtas>(mblock_begin, num_experts, n_blocks, num_tiles, m_group, u, rank);
    const TileCoord tc = o.tc;
    const int tile = o.tile;
    const int m_row0 = tc.m_block * kGemmBlockM;
    const int rows_left = row_begin[tc.expert + 1] - row_begin[tc.expert] - m_row0;
    const int rows_valid =
        o.shadow ? 0 : max(0, min(kStagedRows, rows_left - kStagedRows * consumer));
    const int row0 = row_begin[tc.expert] + m_row0 + kStagedRows * consumer;
    float p[2];
    load_row_probs<kAct>(row_prob, row0, rows_valid, p);
    if (rows_valid == 0) {
      pass_fp8_tile(s.ring, it, k_blocks, tile, leader, kStagingBarrier + consumer, timeout_ns,
                    report, release);
      continue;
    }
    consume_fp8_tile(s.ring, it, k_blocks, tile, consumer, leader, row_begin[tc.expert] + m_row0,
                     acc, timeout_ns, report, release);
    store_rows_staged<kAct, kTileCols>(acc, s.staged[consumer],
                                        EpilogueTensor{&out_map, out, out_stride},
                                        EpilogueTensor{&h_map, h_out, h_stride}, row0,
                                        rows_left >= kStagedRows * (consumer + 1), rows_valid,
                                        tc.n_block * kTileN, n_out, p, consumer, leader);
  }
  if (leader) bulk_wait_read<0>();  // the last stores have read shared memory before exit
}

struct Fp8Launch {
  CUtensorMap a_map, a_scales_map, w_map, out_map, h_map;
  Fp8Weights w;
  const int32_t* offsets;
  int num_experts, m_group, n_out, k_dim;
  const float* row_prob;
  __nv_bfloat16* out;
  int64_t out_stride;
  __nv_bfloat16* h_out;
  int64_t h_stride, timeout_ns, rank;
};

template <int kAct, int kStages, int kTileCols = kFp8BlockN>
void launch(const Fp8Launch& l, int ctas) {
  int* report = timeout_report_device(kReportGroupedGemm, l.rank, l.timeout_ns);
  const auto timeout = static_cast<uint64_t>(l.timeout_ns);
  const size_t smem = fp8_smem_bytes<kStages, kTileCols>(l.num_experts);
  // One argument list for both launches: one CTA per tile, or clusters of two.
  const auto run = [&](auto kernel, int cluster_ctas) {
    const auto start = [&](const auto&... args) {
      if (cluster_ctas == 1) {
        launch_persistent(kernel, smem, args...);
      } else {
        launch_persistent_clusters(kernel, smem, cluster_ctas, args...);
      }
    };
    start(l.a_map, l.a_scales_map, l.w_map, l.out_map, l.h_map, l.w, l.offsets, l.num_experts,
          l.m_group, l.n_out, l.k_dim, l.row_prob, l.out, l.out_stride, l.h_out, l.h_stride,
          timeout, report);
  };
  if (ctas == 2) return run(fp8_grouped_gemm_kernel<kAct, kStages, 2, kTileCols>, 2);
  run(fp8_grouped_gemm_kernel<kAct, kStages, 1, kTileCols>, 1);
}

template <int kStages, int kTileCols = kFp8BlockN>
void launch_epilogue(const Fp8Launch& l, int64_t activation, int ctas) {
  if (activation == kPlain) {
    launch<kPlain, kStages, kTileCols>(l, ctas);
  } else {
    MOK_DISPATCH_ACTIVATION(activation, KACT, (launch<KACT, kStages, kTileCols>(l, ctas)));
  }
}

// The requested ring depth (0: the deepest that fits beside this launch's expert tables; the
// shallowest fits with every expert count, static_assert above).
int ring_stages(int64_t requested, int64_t num_experts) {
  static_assert(kFp8MinStages == 5 && kFp8MaxStages == 6, "the launch instantiates 5 and 6");
  const bool deepest_fits = fp8_smem_bytes<kFp8MaxStages>(num_experts) <= kMaxDynamicSmemBytes;
  if (requested == 0) return deepest_fits ? kFp8MaxStages : kFp8MinStages;
  MOK_HOST_CHECK(requested >= kFp8MinStages && requested <= kFp8MaxStages,
                 "fp8_grouped_gemm: stages must be 0 (the deepest that fits) or ", kFp8MinStages,
                 "..", kFp8MaxStages, ", got ", requested);
  MOK_HOST_CHECK(requested == kFp8MinStages || deepest_fits, "fp8_grouped_gemm: ", requested,
                 " stages do not fit shared memory beside ", num_experts, " experts' tables (",
                 fp8_smem_bytes<kFp8MaxStages>(num_experts), " > ", kMaxDynamicSmemBytes,
                 " bytes)");
  return static_cast<int>(requested);
}

}  // namespace

void fp8_grouped_gemm(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& w,
                      const at::Tensor& w_scales, const at::Tensor& offsets,
                      const c10::optional<at::Tensor>& row_prob, int64_t activation,
                      at::Tensor& out, const c10::optional<at::Tensor>& h_out,
                      int64_t timeout_ns, int64_t rank, int64_t stages, int64_t m_group,
                      int64_t cluster_ctas, int64_t block_n) {
  const char* what = "fp8_grouped_gemm";
  MOK_HOST_CHECK(a.is_cuda() && w.is_cuda() && offsets.is_cuda() && out.is_cuda() &&
                     a_scales.device() == a.device() && w_scales.device() == w.device(),
                 what, ": all tensors must be on the GPU");
  MOK_HOST_CHECK(a.scalar_type() == at::kFloat8_e4m3fn && w.scalar_type() == at::kFloat8_e4m3fn &&
                     out.scalar_type() == at::kBFloat16,
                 what, ": A and W must be float8_e4m3fn codes, out bf16");
  MOK_HOST_CHECK(a.dim() == 2 && w.dim() == 3 && out.dim() == 2,
                 what, ": A [rows, K], W [E, N, K], out [rows, N_out]");
  MOK_HOST_CHECK(offsets.scalar_type() == at::kInt && offsets.dim() == 1 &&
                     offsets.is_contiguous(),
                 what, ": offsets must be a contiguous int32 vector");
  const int64_t num_experts = w.size(0), k_dim = a.size(1), rows = a.size(0);
  MOK_HOST_CHECK(offsets.numel() == num_experts + 1, what, ": offsets needs E + 1 = ",
                 num_experts + 1, " entries, got ", offsets.numel());
  MOK_HOST_CHECK(num_experts >= 1 && num_experts <= kGemmMaxExperts,
                 what, ": 1..", kGemmMaxExperts, " experts per launch, got ", num_experts);
  MOK_HOST_CHECK(w.size(2) == k_dim, what, ": W's K (", w.size(2), ") != A's K (", k_dim, ")");
  MOK_HOST_CHECK(k_dim > 0, what, ": K must be positive");
  MOK_HOST_CHECK(a.stride(1) == 1 && w.stride(2) == 1 && out.stride(1) == 1 &&
                     a.stride(0) % 16 == 0 && w.stride(1) % 16 == 0 && w.stride(0) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0,
                 what, ": rows of A and W must be contiguous and 16-byte aligned (K a multiple "
                 "of 16)");
  const bool gated = activation != kPlain && is_gated(static_cast<int>(activation));
  const int64_t n_rows = w.size(1), n_out = gated ? n_rows / 2 : n_rows;
  const int halves = gated ? 2 : 1;
  MOK_HOST_CHECK(!gated || n_out % 64 == 0,
                 what, ": a gated W's halves must be whole 64-row pieces of 128-row scale "
                 "blocks (F a multiple of 64), got F = ", n_out);
  MOK_HOST_CHECK(n_out % 8 == 0, what, ": N_out must be a multiple of 8");
  const int64_t k_blocks = (k_dim + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  MOK_HOST_CHECK(a_scales.scalar_type() == at::kByte && a_scales.dim() == 2 &&
                     a_scales.size(0) == k_blocks && a_scales.size(1) >= rows &&
                     a_scales.stride(1) == 1 && a_scales.stride(0) % 16 == 0,
                 what, ": a_scales must be uint8 E8M0 [", k_blocks, ", >= ", rows,
                 "] with rows padded to 16, got ", a_scales.sizes());
  const int64_t row_blocks = (n_rows + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  MOK_HOST_CHECK(w_scales.scalar_type() == at::kByte && w_scales.is_contiguous() &&
                     w_scales.dim() == 3 && w_scales.size(0) == num_experts &&
                     w_scales.size(1) == row_blocks && w_scales.size(2) == k_blocks,
                 what, ": w_scales must be contiguous uint8 E8M0 per 128 x 128 block [",
                 num_experts, ", ", row_blocks, ", ", k_blocks, "], got ", w_scales.sizes());
  MOK_HOST_CHECK(out.size(0) >= rows && out.size(1) == n_out && out.stride(0) % 8 == 0,
                 what, ": out must be [>= rows, ", n_out, "] with rows 16-byte aligned");
  MOK_HOST_CHECK(activation == kPlain || (row_prob && row_prob->is_cuda() &&
                                          row_prob->scalar_type() == at::kFloat &&
                                          row_prob->is_contiguous() && row_prob->numel() >= rows),
                 what, ": an activation epilogue needs row_prob (fp32, one per row)");
  __nv_bfloat16* h_ptr = nullptr;
  int64_t h_stride = 0;
  if (h_out) {
    MOK_HOST_CHECK(activation != kPlain, what, ": h_out only with an activation");
    MOK_HOST_CHECK(h_out->is_cuda() && h_out->scalar_type() == at::kBFloat16 &&
                       h_out->dim() == 2 && h_out->stride(1) == 1 && h_out->stride(0) % 8 == 0 &&
                       h_out->size(0) >= rows && h_out->size(1) == n_rows,
                   what, ": h_out must be bf16 [>= rows, N] with 16-byte aligned rows");
    h_ptr = reinterpret_cast<__nv_bfloat16*>(h_out->data_ptr());
    h_stride = h_out->stride(0);
  }
  MOK_HOST_CHECK(m_group >= 0 && m_group <= 65536, what, ": m_group must be 0 (the default, ",
                 kFp8TileGroupMBlocks, ") or 1..65536 m-blocks, got ", m_group);
  MOK_HOST_CHECK(cluster_ctas == 1 || cluster_ctas == 2, what,
                 ": cluster_ctas must be 1 or 2 (CTA pairs sharing weight tiles), got ",
                 cluster_ctas);
  MOK_HOST_CHECK(block_n == 0 || block_n == kFp8BlockN || block_n == kFp8WideBlockN, what,
                 ": block_n must be 0 (", kFp8BlockN, "), ", kFp8BlockN, " or ", kFp8WideBlockN,
                 ", got ", block_n);
  const bool wide = block_n == kFp8WideBlockN;
  MOK_HOST_CHECK(!wide || stages == 0 || stages == kFp8WideStages, what, ": ", kFp8WideBlockN,
                 "-column tiles run ", kFp8WideStages, " stages (stages 0 or ", kFp8WideStages,
                 ")");
  // checked before anything runs
  const int64_t ring = wide ? kFp8WideStages : ring_stages(stages, num_experts);
  if (rows == 0) return;
  c10::cuda::CUDAGuard guard(a.device());

  Fp8Launch l;
  l.a_map = sm90::fp8_row_tile_map(a.data_ptr(), rows, k_dim, a.stride(0));
  l.a_scales_map = sm90::fp8_row_scales_map(a_scales.data_ptr(), k_blocks, rows,
                                            a_scales.stride(0),
                                            kFp8BlockK / Fp8BlockScales::kScaleK);
  const int tile_rows = wide ? kFp8WideBlockN : kFp8BlockN;
  l.w_map = cluster_ctas == 2
                ? sm90::fp8_expert_weight_half_map(w.data_ptr(), num_experts, n_rows, k_dim,
                                                   w.stride(0), w.stride(1), halves, tile_rows)
                : sm90::fp8_expert_weight_map(w.data_ptr(), num_experts, n_rows, k_dim,
                                              w.stride(0), w.stride(1), halves, tile_rows);
  // The boxes the epilogue stages a tile's output columns in (a wide gated tile's 96: three
  // of 32 columns).
  const auto box_cols = static_cast<uint32_t>(sm90::staged_box_cols(tile_rows / halves));
  l.out_map = sm90::staged_rows_map(out.data_ptr(), out.size(0), n_out, 1, out.stride(0), 0,
                                    box_cols);
  l.h_map = h_out ? sm90::staged_rows_map(h_ptr, h_out->size(0), n_out, halves, h_stride, 0,
                                          box_cols)
                  : CUtensorMap{};
  l.w = Fp8Weights{w_scales.data_ptr<uint8_t>(), static_cast<int>(row_blocks),
                   static_cast<int>(n_out)};
  l.offsets = offsets.data_ptr<int32_t>();
  l.num_experts = static_cast<int>(num_experts);
  l.n_out = static_cast<int>(n_out);
  l.k_dim = static_cast<int>(k_dim);
  l.row_prob = activation == kPlain ? nullptr : row_prob->data_ptr<float>();
  l.out = reinterpret_cast<__nv_bfloat16*>(out.data_ptr());
  l.out_stride = out.stride(0);
  l.h_out = h_ptr;
  l.h_stride = h_stride;
  l.timeout_ns = timeout_ns;
  l.rank = rank;
  l.m_group = static_cast<int>(m_group == 0 ? kFp8TileGroupMBlocks : m_group);
  if (wide) {
    launch_epilogue<kFp8WideStages, kFp8WideBlockN>(l, activation,
                                                    static_cast<int>(cluster_ctas));
  } else if (ring == 5) {
    launch_epilogue<5>(l, activation, static_cast<int>(cluster_ctas));
  } else {
    launch_epilogue<6>(l, activation, static_cast<int>(cluster_ctas));
  }
}

}  // namespace mok
