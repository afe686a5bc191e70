// CUTLASS's sm90 grouped GEMM with blockwise scaling (the ptr-array FP8 "Blockwise" mainloop,
// KernelPtrArrayTmaWarpSpecialized{Cooperative,Pingpong}FP8Blockwise) on our expert problem:
// per expert e, D[rows of e] (bf16, [m_e, N]) = A[rows of e] (E4M3 [m_e, K], one fp32 scale per
// 1 x 128) x B[e]^T (E4M3 [N, K], one fp32 scale per 128 x 128), fp32 accumulation promoted
// once per 128 of K. A baseline for scripts/bench_gemm.py, not part of the product.
//
// prepare_grouped_gemm<Variant> fills the per-group tables (problem shapes, operand and scale
// pointers, strides) on the device from the experts' row offsets, builds the kernel's
// parameters (TMA descriptors) and returns a launch that only runs the GEMM: the benchmark
// times that launch. Scale layouts, as the collective reads them for a grouped problem (it
// derives each group's layout from (m_e, N, K) and ignores the layout arrays it is given):
//   A's scales  M-major per group: [K / 128, m_e] fp32, group e's block at K / 128 * offsets[e]
//   B's scales  N-major per group: [K / 128, N / 128] fp32, expert e's at e * N / 128 * K / 128
// (fp8_grouped_baselines.cutlass_operands converts our E8M0 codes into these).
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cstdint>
#include <memory>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "variants.h"

namespace cutlass_probe {

using namespace cute;

using ElementAB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // A [m_e, K], K contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // B [N, K], K contiguous (CUTLASS's K x N)
using LayoutD = cutlass::layout::RowMajor;     // D [m_e, N]
constexpr int kAlignmentAB = 16;               // elements per 16-byte TMA access
constexpr int kAlignmentD = 8;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
// 1 x 128 scales on A, 128 x 128 on B, both M/N-major (example 68's layouts; its sparse-groups
// variant reads B's K-major, which the header's own note says sm90 does not support yet).
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

// One compiled configuration: mainloop/epilogue schedule pair, CTA tile, cluster shape.
template <class MainloopSchedule, class EpilogueSchedule, class Tile, class Cluster>
struct Variant {
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlignmentD,  // no C operand: D = accumulator
      ElementD, LayoutD*, kAlignmentD, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementAB, cute::tuple<LayoutA*, LayoutSFA*>, kAlignmentAB,
      ElementAB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignmentAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

// The device tables of one call, one entry per group (expert).
template <class V>
struct GroupTables {
  typename ProblemShape::UnderlyingProblemShape* shapes;
  const ElementAB** a;
  const ElementAB** b;
  ElementD** d;
  const float** a_scales;
  const float** b_scales;
  typename V::StrideA* stride_a;
  typename V::StrideB* stride_b;
  typename V::StrideD* stride_d;
  LayoutSFA* layout_sfa;
  LayoutSFB* layout_sfb;
};

// One thread per group: its rows offsets[e]:offsets[e + 1], the operands' addresses and
// strides, and its scale blocks' addresses in the layouts above.
template <class V>
__global__ void fill_group_tables(GroupTables<V> t, const int* offsets, int groups, int n, int k,
                                  const ElementAB* a, const ElementAB* b, ElementD* d,
                                  const float* a_scales, const float* b_scales) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= groups) return;
  const int first = offsets[e];
  const int m = offsets[e + 1] - first;
  const int k_blocks = (k + 127) / 128;
  const int n_blocks = (n + 127) / 128;
  t.shapes[e] = make_shape(m, n, k);
  t.a[e] = a + int64_t(first) * k;
  t.b[e] = b + int64_t(e) * n * k;
  t.d[e] = d + int64_t(first) * n;
  t.a_scales[e] = a_scales + int64_t(first) * k_blocks;
  t.b_scales[e] = b_scales + int64_t(e) * n_blocks * k_blocks;
  t.stride_a[e] = cutlass::make_cute_packed_stride(typename V::StrideA{}, make_shape(m, k, 1));
  t.stride_b[e] = cutlass::make_cute_packed_stride(typename V::StrideB{}, make_shape(n, k, 1));
  t.stride_d[e] = cutlass::make_cute_packed_stride(typename V::StrideD{}, make_shape(m, n, 1));
  t.layout_sfa[e] = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
  t.layout_sfb[e] = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
}

inline void check(bool ok, const char* what) { TORCH_CHECK(ok, "cutlass_fp8_grouped: ", what); }

// `count` entries of T at `offset` bytes past `base` (16-byte aligned); moves `offset` on.
template <class T>
T* carve(uintptr_t base, size_t& offset, int count) {
  T* at = reinterpret_cast<T*>(base + offset);
  offset += (sizeof(T) * count + 15) / 16 * 16;
  return at;
}

template <class V>
Launch prepare_grouped_gemm(const Problem& p) {
  using Gemm = typename V::Gemm;
  const int groups = static_cast<int>(p.w.size(0));
  const int n = static_cast<int>(p.w.size(1));
  const int k = static_cast<int>(p.w.size(2));
  check(p.a.is_contiguous() && p.w.is_contiguous() && p.out.is_contiguous(),
        "a, w and out must be contiguous (rows of K codes, rows of N outputs)");
  check(p.a.size(1) == k && p.out.size(1) == n, "a is [rows, K], w [E, N, K], out [rows, N]");
  check(p.offsets.numel() == groups + 1, "offsets holds E + 1 row offsets");
  check(k % 128 == 0 && n % 128 == 0, "N and K must be multiples of 128");

  const c10::cuda::CUDAGuard device(p.a.device());
  // One device buffer for every table, filled by one launch: nothing is read on the host.
  // The first pass sizes it, the second places the tables in it.
  torch::Tensor tables;
  uintptr_t base = 0;
  GroupTables<V> t{};
  for (int pass = 0; pass < 2; ++pass) {
    size_t offset = 0;
    t.shapes = carve<typename ProblemShape::UnderlyingProblemShape>(base, offset, groups);
    t.a = carve<const ElementAB*>(base, offset, groups);
    t.b = carve<const ElementAB*>(base, offset, groups);
    t.d = carve<ElementD*>(base, offset, groups);
    t.a_scales = carve<const float*>(base, offset, groups);
    t.b_scales = carve<const float*>(base, offset, groups);
    t.stride_a = carve<typename V::StrideA>(base, offset, groups);
    t.stride_b = carve<typename V::StrideB>(base, offset, groups);
    t.stride_d = carve<typename V::StrideD>(base, offset, groups);
    t.layout_sfa = carve<LayoutSFA>(base, offset, groups);
    t.layout_sfb = carve<LayoutSFB>(base, offset, groups);
    if (pass == 0) {
      tables = torch::empty({static_cast<int64_t>(offset)}, p.a.options().dtype(torch::kUInt8));
      base = reinterpret_cast<uintptr_t>(tables.data_ptr());
    }
  }
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  fill_group_tables<V><<<(groups + 127) / 128, 128, 0, stream>>>(
      t, p.offsets.data_ptr<int>(), groups, n, k,
      static_cast<const ElementAB*>(p.a.data_ptr()), static_cast<const ElementAB*>(p.w.data_ptr()),
      static_cast<ElementD*>(p.out.data_ptr()), p.a_scales.data_ptr<float>(),
      p.w_scales.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  cutlass::KernelHardwareInfo hw;
  hw.device_id = p.a.get_device();
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);

  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {groups, t.shapes, nullptr},  // problem shapes on the device only
      {t.a, t.stride_a, t.b, t.stride_b, t.a_scales, t.layout_sfa, t.b_scales, t.layout_sfb},
      {{}, nullptr, nullptr, t.d, t.stride_d},
      hw};
  auto& fusion = args.epilogue.thread;
  fusion.alpha = 1.0f;
  fusion.beta = 0.0f;
  fusion.alpha_ptr = nullptr;
  fusion.beta_ptr = nullptr;
  fusion.alpha_ptr_array = nullptr;
  fusion.beta_ptr_array = nullptr;
  fusion.dAlpha = {_0{}, _0{}, 0};
  fusion.dBeta = {_0{}, _0{}, 0};
  using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.raster_order = p.raster == 1   ? Raster::AlongM
                                : p.raster == 2 ? Raster::AlongN
                                                : Raster::Heuristic;
  args.scheduler.max_swizzle_size = p.swizzle;

  auto gemm = std::make_shared<Gemm>();
  check(gemm->can_implement(args) == cutlass::Status::kSuccess, "can_implement refused the problem");
  auto workspace = torch::empty({static_cast<int64_t>(Gemm::get_workspace_size(args)) + 1},
                                p.a.options().dtype(torch::kUInt8));
  check(gemm->initialize(args, workspace.data_ptr(), stream) == cutlass::Status::kSuccess,
        "initialize failed");
  // The launch keeps the operands, tables and workspace alive as long as it exists.
  auto keep = std::make_shared<std::vector<torch::Tensor>>(std::vector<torch::Tensor>{
      tables, workspace, p.a, p.a_scales, p.w, p.w_scales, p.offsets, p.out});
  return [gemm, keep]() {
    const auto status = gemm->run(at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(status == cutlass::Status::kSuccess, "cutlass_fp8_grouped: run failed: ",
                cutlass::cutlassGetStatusString(status));
  };
}

}  // namespace cutlass_probe
