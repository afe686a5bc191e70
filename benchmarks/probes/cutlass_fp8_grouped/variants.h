// The compiled configurations of the CUTLASS grouped blockwise GEMM (grouped_gemm.cuh), each
// defined in the .cu of its schedule; bindings.cpp lists them by name.
#pragma once

#include <torch/extension.h>

#include <functional>

namespace cutlass_probe {

// What one call gets from Python: tensors already in CUTLASS's layouts (grouped_gemm.cuh), and
// the tile scheduler's run-time options (raster: 0 heuristic, 1 along M, 2 along N; swizzle
// 1/2/4/8).
struct Problem {
  torch::Tensor a, a_scales, w, w_scales, offsets, out;
  int raster = 0;
  int swizzle = 1;
};

// A prepared launch: runs the GEMM on the current stream; owns its tables and workspace.
using Launch = std::function<void()>;

// Cooperative: both consumer warpgroups share one tile (each half of its rows).
Launch prepare_cooperative_128x128_c1x1(const Problem& p);
Launch prepare_cooperative_128x128_c1x2(const Problem& p);  // CUTLASS example 68's
Launch prepare_cooperative_256x128_c1x1(const Problem& p);
// Ping-pong: each consumer warpgroup owns a tile; one's epilogue overlaps the other's MMAs.
Launch prepare_pingpong_128x128_c1x1(const Problem& p);     // example 68's sparse-groups one
Launch prepare_pingpong_64x128_c1x1(const Problem& p);

}  // namespace cutlass_probe
