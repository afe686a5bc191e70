#include "gemm/sm90/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "common/error.cuh"
#include "config/kernel_config.cuh"

namespace mok::sm90 {
namespace {

// The driver entry point through the runtime, so the extension needs no -lcuda.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    MOK_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                    cudaEnableDefault, &status));
    MOK_HOST_CHECK(status == cudaDriverEntryPointSuccess && ptr != nullptr,
                   "the CUDA driver has no cuTensorMapEncodeTiled (driver too old for TMA)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

namespace {

CUtensorMap encode_4d(CUtensorMapDataType type, const void* base,
                      const std::array<uint64_t, 4>& dims,
                      const std::array<uint64_t, 3>& strides_bytes,
                      const std::array<uint32_t, 4>& box, CUtensorMapSwizzle swizzle) {
  MOK_HOST_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0,
                 "TMA needs a 16-byte aligned base address");
  for (uint64_t s : strides_bytes) {
    MOK_HOST_CHECK(s % 16 == 0 && s < (uint64_t(1) << 40),
                   "TMA needs strides that are multiples of 16 bytes, got ", s);
  }
  CUtensorMap map;
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult res = encode_tiled()(
      &map, type, 4, const_cast<void*>(base), dims.data(), strides_bytes.data(), box.data(),
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MOK_HOST_CHECK(res == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", int(res),
                 ") for dims [", dims[0], ", ", dims[1], ", ", dims[2], ", ", dims[3], "]");
  return map;
}

}  // namespace

CUtensorMap make_bf16_tensor_map_4d(const void* base, const std::array<uint64_t, 4>& dims,
                                    const std::array<uint64_t, 3>& strides_bytes,
                                    const std::array<uint32_t, 4>& box) {
  MOK_HOST_CHECK(box[0] * 2 == 128, "the innermost TMA box must be one 128-byte row");
  return encode_4d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, dims, strides_bytes, box,
                   CU_TENSOR_MAP_SWIZZLE_128B);
}

CUtensorMap row_tile_map(const void* base, uint64_t rows, uint64_t cols, uint64_t row_stride) {
  const uint64_t row_bytes = row_stride * 2;
  return make_bf16_tensor_map_4d(base, {cols, rows, 1, 1},
                                 {row_bytes, rows * row_bytes, rows * row_bytes},
                                 {kGemmBlockK, kGemmBlockM, 1, 1});
}

CUtensorMap expert_weight_map(const void* base, uint64_t experts, uint64_t rows, uint64_t k,
                              uint64_t expert_stride, uint64_t row_stride, int halves,
                              uint32_t box_rows) {
  const uint64_t n = rows / halves, row_bytes = row_stride * 2;
  return make_bf16_tensor_map_4d(
      base, {k, n, uint64_t(halves), experts}, {row_bytes, row_bytes * n, expert_stride * 2},
      {kGemmBlockK, box_rows > 0 ? box_rows : uint32_t(kGemmBlockN / halves), 1, 1});
}

CUtensorMap staged_rows_map(const void* base, uint64_t rows, uint64_t n_out, int halves,
                            uint64_t row_stride, uint32_t box_rows, uint32_t box_cols) {
  MOK_HOST_CHECK(box_cols == 64 || box_cols == 32, "staged boxes are 64 or 32 columns wide");
  const uint64_t row_bytes = row_stride * 2;
  return encode_4d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, {n_out, uint64_t(halves), rows, 1},
                   {n_out * 2, row_bytes, rows * row_bytes},
                   {box_cols, 1, box_rows > 0 ? box_rows : kGemmWarpgroupRows, 1},
                   box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
}

CUtensorMap mn_major_rows_map(const void* base, uint64_t rows, uint64_t cols,
                              uint64_t row_stride) {
  const uint64_t row_bytes = row_stride * 2;
  return make_bf16_tensor_map_4d(base, {cols, rows, 1, 1},
                                 {row_bytes, rows * row_bytes, rows * row_bytes},
                                 {64, kGemmBlockK, 1, 1});
}

CUtensorMap expert_weight_mn_map(const void* base, uint64_t experts, uint64_t k, uint64_t n,
                                 uint64_t expert_stride, uint64_t row_stride) {
  const uint64_t expert_bytes = expert_stride * 2;
  return make_bf16_tensor_map_4d(base, {n, k, experts, 1},
                                 {row_stride * 2, expert_bytes, expert_bytes * experts},
                                 {64, kGemmBlockK, 1, 1});
}

CUtensorMap expert_weight_codes_map(const void* base, uint64_t experts, uint64_t rows,
                                    uint64_t k, uint64_t expert_stride, uint64_t row_stride,
                                    int halves) {
  const uint64_t n = rows / halves;
  return encode_4d(CU_TENSOR_MAP_DATA_TYPE_UINT8, base, {k, n, uint64_t(halves), experts},
                   {row_stride, row_stride * n, expert_stride},
                   {kGemmBlockK, uint32_t(kGemmBlockN / halves), 1, 1},
                   CU_TENSOR_MAP_SWIZZLE_NONE);
}

CUtensorMap expert_weight_scales_map(const void* base, uint64_t experts, uint64_t blocks,
                                     int halves, uint64_t half_rows, uint64_t padded_rows) {
  return encode_4d(CU_TENSOR_MAP_DATA_TYPE_UINT8, base,
                   {half_rows, uint64_t(halves), blocks, experts},
                   {padded_rows, padded_rows * halves, padded_rows * halves * blocks},
                   {uint32_t(kGemmBlockN / halves), 1,
                    uint32_t(kGemmBlockK >= kMxBlock ? kGemmBlockK / kMxBlock : 1), 1},
                   CU_TENSOR_MAP_SWIZZLE_NONE);
}

CUtensorMap fp8_row_tile_map(const void* base, uint64_t rows, uint64_t k, uint64_t row_stride) {
  return encode_4d(CU_TENSOR_MAP_DATA_TYPE_UINT8, base, {k, rows, 1, 1},
                   {row_stride, rows * row_stride, rows * row_stride},
                   {kFp8BlockK, kGemmBlockM, 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B);
}

CUtensorMap fp8_expert_weight_map(const void* base, uint64_t experts, uint64_t rows, uint64_t k,
                                  uint64_t expert_stride, uint64_t row_stride, int halves,
                                  int tile_rows) {
  const uint64_t n = rows / halves;
  return encode_4d(CU_TENSOR_MAP_DATA_TYPE_UINT8, base, {k, n, uint64_t(halves), experts},
                   {row_stride, row_stride * n, expert_stride},
                   {kFp8BlockK, uint32_t(tile_rows / halves), 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B);
}

CUtensorMap fp8_expert_weight_half_map(const void* base, uint64_t experts, uint64_t rows,
                                       uint64_t k, uint64_t expert_stride, uint64_t row_stride,
                                       int halves, int tile_rows) {
  const uint64_t n = rows / halves;
  return encode_4d(CU_TENSOR_MAP_DATA_TYPE_UINT8, base, {k, n, uint64_t(halves), experts},
                   {row_stride, row_stride * n, expert_stride},
                   {kFp8BlockK, uint32_t(tile_rows / 2), 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B);
}

CUtensorMap fp8_row_scales_map(const void* base, uint64_t k_blocks, uint64_t rows,
                               uint64_t row_stride, int blocks_per_stage) {
  return encode_4d(CU_TENSOR_MAP_DATA_TYPE_UINT8, base, {rows, k_blocks, 1, 1},
                   {row_stride, row_stride * k_blocks, row_stride * k_blocks},
                   {kFp8RowScaleBox, uint32_t(blocks_per_stage), 1, 1},
                   CU_TENSOR_MAP_SWIZZLE_NONE);
}

CUtensorMap fp8_staged_codes_map(const void* base, uint64_t rows, uint64_t k,
                                 uint64_t row_stride) {
  return encode_4d(CU_TENSOR_MAP_DATA_TYPE_UINT8, base, {k, rows, 1, 1},
                   {row_stride, rows * row_stride, rows * row_stride},
                   {kFp8ScaleBlock, kGemmWarpgroupRows, 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace mok::sm90
