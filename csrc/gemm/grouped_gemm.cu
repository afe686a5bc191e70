// Grouped GEMM tile engine: out[rows of expert e] = epilogue(A[rows of e] @ W[e]^T), for all
// local experts in one persistent launch. A is [rows, K] (rows grouped by expert, expert e
// owning rows offsets[e] .. offsets[e+1], a device-side prefix), W is [E, N, K] (Megatron's
// FC1 [2F, H] / FC2 [H, F] per expert): both operands K-major, so both go through TMA with
// 128-byte swizzle straight into the layout wgmma reads.
//
// Epilogues:
//   plain       out = bf16(acc)                                     (FC2)
//   activation  out = bf16(act(bf16(acc)) * prob[row])             (FC1, non-gated)
//   gated       out = bf16(act(bf16(g)) * bf16(u) * prob[row])      (FC1, SwiGLU / GeGLU)
// The rounding points are those of the reference (FC1 output in bf16, activation in fp32),
// and h_out, when given, receives the bf16 pre-activation that backward needs.
//
// Schedule: tiles are numbered expert-major (expert, m-block, n-block) from the device-side
// offsets, so the host never learns the row counts; CTA b takes tiles b, b + grid, ...
// Each output element is computed by exactly one tile in a fixed K order: deterministic.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "config/kernel_config.cuh"
#include "epilogue/activation_math.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/tma.cuh"
#include "gemm/sm90/wgmma.cuh"
#include "ops.h"

namespace mok {
namespace {

constexpr int kPlain = -1;  // epilogue id: no activation
constexpr int kProducerRole = 0, kConsumerRole = 1;  // in the timeout report
constexpr int kReportInts = 4;                        // {role, block, tile, stage}
constexpr int kATileBytes = kGemmBlockM * kGemmBlockK * 2;
constexpr int kBTileBytes = kGemmBlockN * kGemmBlockK * 2;
constexpr int kStageBytes = kATileBytes + kBTileBytes;
constexpr int kAccRegs = kGemmBlockN / 2;  // m64 x n256 fp32 over 128 threads

struct SharedStorage {
  uint8_t a[kGemmStages][kATileBytes];  // each 1024-aligned: the swizzle atom
  uint8_t b[kGemmStages][kBTileBytes];
  uint64_t full[kGemmStages];
  uint64_t empty[kGemmStages];
  int32_t row_begin[kGemmMaxExperts + 1];
  int32_t tile_begin[kGemmMaxExperts + 1];
};
constexpr size_t kSharedBytes = sizeof(SharedStorage) + 1024;  // + alignment slack

struct TileCoord {
  int expert, m_block, n_block;
};

__device__ __forceinline__ TileCoord decode_tile(const SharedStorage& s, int num_experts,
                                                 int n_blocks, int tile) {
  int lo = 0, hi = num_experts;  // last e with tile_begin[e] <= tile
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (s.tile_begin[mid] <= tile) lo = mid; else hi = mid;
  }
  const int local = tile - s.tile_begin[lo];
  return {lo, local / n_blocks, local % n_blocks};
}

// Warp 0 loads the row offsets and turns them into tile offsets (warp-wide prefix sums).
__device__ void build_tile_table(SharedStorage& s, const int32_t* offsets, int num_experts,
                                 int n_blocks) {
  const int lane = threadIdx.x % 32;
  int carry = 0;
  for (int base = 0; base <= num_experts; base += 32) {
    const int e = base + lane;
    int tiles = 0;
    if (e <= num_experts) {
      const int begin = offsets[e];
      s.row_begin[e] = begin;
      if (e < num_experts) {
        const int rows = offsets[e + 1] - begin;
        tiles = (rows + kGemmBlockM - 1) / kGemmBlockM * n_blocks;
      }
    }
    int incl = tiles;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    if (e <= num_experts) s.tile_begin[e] = carry + incl - tiles;
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
}

__device__ __forceinline__ void store_pair(__nv_bfloat16* out, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(a, b);
}

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

template <int kAct>
__device__ __forceinline__ float activate(float h) {
  if constexpr (kAct == kPlain) return h;
  else return act_eval<kAct>(h).f;
}

// Writes this thread's part of one finished tile (rows of one consumer warpgroup).
template <int kAct>
__device__ __forceinline__ void epilogue(const float (&d)[kAccRegs], int tile_row0, int rows_left,
                                         int col0, int n_out, int consumer,
                                         const float* __restrict__ row_prob,
                                         __nv_bfloat16* __restrict__ out, int64_t out_stride,
                                         __nv_bfloat16* __restrict__ h_out, int64_t h_stride) {
  constexpr bool kGated = kAct != kPlain && is_gated(kAct);
  constexpr int kCols = kGated ? kGemmBlockN / 2 : kGemmBlockN;
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 64 * consumer + 16 * warp + lane / 4 + 8 * i;
    if (r >= rows_left) continue;
    const int64_t row = tile_row0 + r;
    const float p = kAct == kPlain ? 1.f : row_prob[row];
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      const int col = col0 + 8 * j + 2 * (lane % 4);
      if (col >= n_out) continue;
      float v[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float h = round_bf16(d[4 * j + 2 * i + c]);
        if constexpr (kGated) {
          const float u = round_bf16(d[4 * (j + kCols / 8) + 2 * i + c]);
          v[c] = activate<kAct>(h) * u * p;
        } else {
          v[c] = activate<kAct>(h) * p;
        }
      }
      store_pair(out + row * out_stride + col, v[0], v[1]);
      if (h_out != nullptr) {
        const int lin = 4 * j + 2 * i;
        store_pair(h_out + row * h_stride + col, d[lin], d[lin + 1]);
        if constexpr (kGated) {
          const int lup = 4 * (j + kCols / 8) + 2 * i;
          store_pair(h_out + row * h_stride + n_out + col, d[lup], d[lup + 1]);
        }
      }
    }
  }
}

template <int kAct>
__global__ void __launch_bounds__(kGemmThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap w_map,
                        const int32_t* __restrict__ offsets, int num_experts, int n_out,
                        int k_dim, const float* __restrict__ row_prob,
                        __nv_bfloat16* __restrict__ out, int64_t out_stride,
                        __nv_bfloat16* __restrict__ h_out, int64_t h_stride,
                        uint64_t timeout_ns, int* report) {
  constexpr bool kGated = kAct != kPlain && is_gated(kAct);
  constexpr int kTileN = kGated ? kGemmBlockN / 2 : kGemmBlockN;  // output columns per tile
  extern __shared__ uint8_t smem_raw[];
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int warpgroup = threadIdx.x / 128;
  const int n_blocks = (n_out + kTileN - 1) / kTileN;
  const int k_blocks = (k_dim + kGemmBlockK - 1) / kGemmBlockK;

  if (threadIdx.x < 32) build_tile_table(s, offsets, num_experts, n_blocks);
  if (threadIdx.x == 32) {
    for (int i = 0; i < kGemmStages; ++i) {
      sm90::mbar_init(&s.full[i], 1);
      sm90::mbar_init(&s.empty[i], kGemmConsumers);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();
  const int num_tiles = s.tile_begin[num_experts];

  if (warpgroup == 0) {
    // Producer: one thread streams A and W tiles through the stage ring.
    sm90::warpgroup_reg_dealloc<kGemmProducerRegs>();
    if (threadIdx.x != 0) return;
    sm90::prefetch_tensor_map(&a_map);
    sm90::prefetch_tensor_map(&w_map);
    int it = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const TileCoord tc = decode_tile(s, num_experts, n_blocks, tile);
      const int row0 = s.row_begin[tc.expert] + tc.m_block * kGemmBlockM;
      const int n0 = tc.n_block * kTileN;
      for (int kb = 0; kb < k_blocks; ++kb, ++it) {
        const int stage = it % kGemmStages;
        const uint32_t parity = (it / kGemmStages) & 1;
        sm90::mbar_wait(&s.empty[stage], parity ^ 1, timeout_ns, kProducerRole, tile, stage,
                        report);
        sm90::mbar_arrive_expect_tx(&s.full[stage], kStageBytes);
        const int k0 = kb * kGemmBlockK;
        sm90::tma_load_4d(s.a[stage], &a_map, &s.full[stage], k0, row0, 0, 0);
        if constexpr (kGated) {
          // W viewed as [E, 2, F, K]: gate rows into the first half of the tile, up rows
          // (the same output columns) into the second.
          sm90::tma_load_4d(s.b[stage], &w_map, &s.full[stage], k0, n0, 0, tc.expert);
          sm90::tma_load_4d(s.b[stage] + kBTileBytes / 2, &w_map, &s.full[stage], k0, n0, 1,
                            tc.expert);
        } else {
          sm90::tma_load_4d(s.b[stage], &w_map, &s.full[stage], k0, n0, 0, tc.expert);
        }
      }
    }
    return;
  }

  // Consumers: warpgroup c owns rows 64(c-1) .. 64c of every tile.
  sm90::warpgroup_reg_alloc<kGemmConsumerRegs>();
  const int consumer = warpgroup - 1;
  const bool leader = threadIdx.x % 128 == 0;
  float acc[kAccRegs];
  int it = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const TileCoord tc = decode_tile(s, num_experts, n_blocks, tile);
    int prev_stage = -1;
    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const int stage = it % kGemmStages;
      sm90::mbar_wait(&s.full[stage], (it / kGemmStages) & 1, timeout_ns, kConsumerRole, tile,
                      stage, report);
      const uint64_t desc_a =
          sm90::smem_desc_k_major_sw128(s.a[stage] + consumer * (kATileBytes / kGemmConsumers));
      const uint64_t desc_b = sm90::smem_desc_k_major_sw128(s.b[stage]);
      sm90::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kGemmBlockK / 16; ++k) {
        sm90::wgmma_m64n256k16_bf16(acc, sm90::desc_advance_k16(desc_a, k),
                                    sm90::desc_advance_k16(desc_b, k), kb > 0 || k > 0);
      }
      sm90::wgmma_commit();
      // Keep one k-block of MMAs in flight; the one before it is done reading its stage.
      sm90::wgmma_wait<1>();
      sm90::fence_accumulators(acc);
      if (prev_stage >= 0 && leader) sm90::mbar_arrive(&s.empty[prev_stage]);
      prev_stage = stage;
    }
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(acc);
    if (prev_stage >= 0 && leader) sm90::mbar_arrive(&s.empty[prev_stage]);

    const int m_row0 = tc.m_block * kGemmBlockM;
    const int rows_left = s.row_begin[tc.expert + 1] - s.row_begin[tc.expert] - m_row0;
    epilogue<kAct>(acc, s.row_begin[tc.expert] + m_row0, rows_left, tc.n_block * kTileN, n_out,
                   consumer, row_prob, out, out_stride, h_out, h_stride);
  }
}

// Where a timed-out wait leaves {role, block, tile, stage}: mapped pinned host memory, so the
// host can read it after the trap has killed the CUDA context.
int* timeout_report_host() {
  static int* report = [] {
    int* p = nullptr;
    MOK_CUDA_CHECK(cudaHostAlloc(&p, kReportInts * sizeof(int),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
    for (int i = 0; i < kReportInts; ++i) p[i] = -1;
    return p;
  }();
  return report;
}

int* timeout_report_device() {
  int* d = nullptr;
  MOK_CUDA_CHECK(cudaHostGetDevicePointer(&d, timeout_report_host(), 0));
  return d;
}

template <int kAct>
void launch(const CUtensorMap& a_map, const CUtensorMap& w_map, const at::Tensor& offsets,
            int num_experts, int n_out, int k_dim, const float* row_prob, at::Tensor& out,
            __nv_bfloat16* h_out, int64_t h_stride, int64_t timeout_ns) {
  auto kernel = grouped_gemm_kernel<kAct>;
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(kSharedBytes)));
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  kernel<<<sms, kGemmThreads, kSharedBytes, at::cuda::getCurrentCUDAStream()>>>(
      a_map, w_map, offsets.data_ptr<int32_t>(), num_experts, n_out, k_dim, row_prob,
      reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), out.stride(0), h_out, h_stride,
      static_cast<uint64_t>(timeout_ns), timeout_report_device());
  MOK_LAUNCH_CHECK();
}

}  // namespace

std::vector<int64_t> grouped_gemm_timeout_report() {
  const volatile int* r = timeout_report_host();
  return {r[0], r[1], r[2], r[3]};
}

void grouped_gemm(const at::Tensor& a, const at::Tensor& w, const at::Tensor& offsets,
                  const c10::optional<at::Tensor>& row_prob, int64_t activation, at::Tensor& out,
                  const c10::optional<at::Tensor>& h_out, int64_t timeout_ns) {
  MOK_HOST_CHECK(a.is_cuda() && w.is_cuda() && offsets.is_cuda() && out.is_cuda(),
                 "grouped_gemm: all tensors must be on the GPU");
  MOK_HOST_CHECK(a.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 &&
                     out.scalar_type() == at::kBFloat16,
                 "grouped_gemm: A, W and out must be bf16");
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
  if (a.size(0) == 0) return;
  c10::cuda::CUDAGuard guard(a.device());

  const uint64_t rows = static_cast<uint64_t>(a.size(0));
  const CUtensorMap a_map = sm90::make_bf16_tensor_map_4d(
      a.data_ptr(), {uint64_t(k_dim), rows, 1, 1},
      {uint64_t(a.stride(0)) * 2, rows * a.stride(0) * 2, rows * a.stride(0) * 2},
      {kGemmBlockK, kGemmBlockM, 1, 1});
  // W viewed as [E, halves, N_out, K]: a gated FC1 loads its gate and up halves as two
  // boxes of half the tile's rows.
  const uint64_t halves = gated ? 2 : 1;
  const uint64_t row_bytes = uint64_t(w.stride(1)) * 2;
  const CUtensorMap w_map = sm90::make_bf16_tensor_map_4d(
      w.data_ptr(), {uint64_t(k_dim), uint64_t(n_out), halves, uint64_t(num_experts)},
      {row_bytes, row_bytes * n_out, uint64_t(w.stride(0)) * 2},
      {kGemmBlockK, static_cast<uint32_t>(kGemmBlockN / halves), 1, 1});
  const float* prob = activation == kPlain ? nullptr : row_prob->data_ptr<float>();
  const int e = static_cast<int>(num_experts), n = static_cast<int>(n_out),
            k = static_cast<int>(k_dim);
  if (activation == kPlain) {
    launch<kPlain>(a_map, w_map, offsets, e, n, k, prob, out, h_ptr, h_stride, timeout_ns);
  } else {
    MOK_DISPATCH_ACTIVATION(activation, KACT,
        launch<KACT>(a_map, w_map, offsets, e, n, k, prob, out, h_ptr, h_stride, timeout_ns));
  }
}

}  // namespace mok
