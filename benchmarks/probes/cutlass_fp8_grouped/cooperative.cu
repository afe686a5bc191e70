// The cooperative-schedule configurations (variants.h).
#include "grouped_gemm.cuh"

namespace cutlass_probe {

template <class Tile, class Cluster>
using Cooperative = Variant<cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                            cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, Tile, Cluster>;

Launch prepare_cooperative_128x128_c1x1(const Problem& p) {
  return prepare_grouped_gemm<Cooperative<Shape<_128, _128, _128>, Shape<_1, _1, _1>>>(p);
}

Launch prepare_cooperative_128x128_c1x2(const Problem& p) {
  return prepare_grouped_gemm<Cooperative<Shape<_128, _128, _128>, Shape<_1, _2, _1>>>(p);
}

Launch prepare_cooperative_256x128_c1x1(const Problem& p) {
  return prepare_grouped_gemm<Cooperative<Shape<_256, _128, _128>, Shape<_1, _1, _1>>>(p);
}

}  // namespace cutlass_probe
