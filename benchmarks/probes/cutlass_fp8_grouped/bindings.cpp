// Python module of the CUTLASS grouped blockwise GEMM baseline: variants() names the compiled
// configurations, prepare(...) returns a callable that launches one on the current stream.
#include <pybind11/functional.h>
#include <torch/extension.h>

#include <map>
#include <string>
#include <vector>

#include "variants.h"

namespace cutlass_probe {
namespace {

using Prepare = Launch (*)(const Problem&);

const std::map<std::string, Prepare>& table() {
  static const std::map<std::string, Prepare> variants{
      {"cooperative_128x128_c1x1", prepare_cooperative_128x128_c1x1},
      {"cooperative_128x128_c1x2", prepare_cooperative_128x128_c1x2},
      {"cooperative_256x128_c1x1", prepare_cooperative_256x128_c1x1},
      {"pingpong_128x128_c1x1", prepare_pingpong_128x128_c1x1},
      {"pingpong_64x128_c1x1", prepare_pingpong_64x128_c1x1},
  };
  return variants;
}

std::vector<std::string> variants() {
  std::vector<std::string> names;
  for (const auto& [name, prepare] : table()) names.push_back(name);
  return names;
}

Launch prepare(const std::string& variant, torch::Tensor a, torch::Tensor a_scales, torch::Tensor w,
               torch::Tensor w_scales, torch::Tensor offsets, torch::Tensor out, int raster,
               int swizzle) {
  const auto found = table().find(variant);
  TORCH_CHECK(found != table().end(), "cutlass_fp8_grouped: no variant ", variant);
  TORCH_CHECK(a.is_cuda() && a.scalar_type() == torch::kFloat8_e4m3fn, "a: E4M3 codes on the GPU");
  TORCH_CHECK(w.is_cuda() && w.scalar_type() == torch::kFloat8_e4m3fn && w.dim() == 3,
              "w: E4M3 codes [E, N, K] on the GPU");
  TORCH_CHECK(a_scales.scalar_type() == torch::kFloat && w_scales.scalar_type() == torch::kFloat,
              "a_scales and w_scales: fp32 (cutlass_operands' layouts)");
  TORCH_CHECK(offsets.scalar_type() == torch::kInt32, "offsets: int32 [E + 1]");
  TORCH_CHECK(out.scalar_type() == torch::kBFloat16, "out: bf16 [rows, N]");
  return found->second(Problem{a, a_scales, w, w_scales, offsets, out, raster, swizzle});
}

}  // namespace
}  // namespace cutlass_probe

PYBIND11_MODULE(cutlass_fp8_grouped, m) {
  m.def("variants", &cutlass_probe::variants, "names of the compiled configurations");
  m.def("prepare", &cutlass_probe::prepare, pybind11::arg("variant"), pybind11::arg("a"),
        pybind11::arg("a_scales"), pybind11::arg("w"), pybind11::arg("w_scales"),
        pybind11::arg("offsets"), pybind11::arg("out"), pybind11::arg("raster") = 0,
        pybind11::arg("swizzle") = 1,
        "fill the group tables on the device and set the kernel up; returns the launch");
}
