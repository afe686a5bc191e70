// The ping-pong-schedule configurations (variants.h).
#include "grouped_gemm.cuh"

namespace cutlass_probe {

template <class Tile, class Cluster>
using Pingpong = Variant<cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong, Tile, Cluster>;

Launch prepare_pingpong_128x128_c1x1(const Problem& p) {
  return prepare_grouped_gemm<Pingpong<Shape<_128, _128, _128>, Shape<_1, _1, _1>>>(p);
}

Launch prepare_pingpong_64x128_c1x1(const Problem& p) {
  return prepare_grouped_gemm<Pingpong<Shape<_64, _128, _128>, Shape<_1, _1, _1>>>(p);
}

}  // namespace cutlass_probe
