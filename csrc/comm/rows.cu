// Row movers over NVLink, a row addressed by its slot (comm/peer_row.cuh). Pull-dispatch: the
// expert owner reads token rows from the source rank's published buffer. Push-combine: the
// owner writes result rows into the source rank's return buffer at (token, slot), one slot
// per (token, k), so no two writers ever touch the same bytes and no atomics are needed. Only
// the first *num_rows rows (a device-side count) are moved: the grid is sized for the worst
// case and idles past it.
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "comm/copy_row.cuh"
#include "comm/peer_row.cuh"
#include "comm/wire_row.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"
#include "quant/mx_format.cuh"

namespace mok {

// Moves rows between this GPU's row buffer (row r) and a peer's region (peer_row).
template <bool kPull>
__global__ void move_rows_kernel(const int64_t* __restrict__ peer_bases, int64_t peer_offset,
                                 const int32_t* __restrict__ row_slot,
                                 const int32_t* __restrict__ num_rows, int64_t per_rank,
                                 int slots_per_remote_row, int64_t row_bytes,
                                 char* __restrict__ local) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  const int rows = *num_rows;
  const int vecs = static_cast<int>(row_bytes / 16);
  for (int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    char* remote = peer_row(peer_bases, peer_offset, row_slot[r], per_rank,
                            slots_per_remote_row, row_bytes);
    int4* mine = reinterpret_cast<int4*>(local + r * row_bytes);
    if constexpr (kPull) {
      copy_row(mine, reinterpret_cast<const int4*>(remote), vecs, lane);
    } else {
      copy_row(reinterpret_cast<int4*>(remote), mine, vecs, lane);
    }
  }
}

// Pull-dispatch of FP8 rows (the FP8 recipes' forward): a source row is a wire row of
// row_bytes, its E4M3 codes in the first code_bytes and then one E8M0 scale code per block of
// the row (quant/mx_round.cu, quantize_wire_rows). Row r's codes land in row r of `codes`
// (code_stride bytes apart) and its scale codes in column r of `scales` ([blocks, scale_stride]):
// the FP8 grouped GEMM's A operand and A-scale layout, with no pass over the rows after the pull.
__global__ void pull_fp8_rows_kernel(const int64_t* __restrict__ peer_bases,
                                     int64_t peer_offset, const int32_t* __restrict__ row_slot,
                                     const int32_t* __restrict__ num_rows, int64_t per_rank,
                                     int topk, int64_t row_bytes, int code_bytes, int blocks,
                                     uint8_t* __restrict__ codes, int64_t code_stride,
                                     uint8_t* __restrict__ scales, int64_t scale_stride) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  const int rows = *num_rows;
  for (int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    const uint8_t* remote = reinterpret_cast<const uint8_t*>(
        peer_row(peer_bases, peer_offset, row_slot[r], per_rank, topk, row_bytes));
    copy_row(reinterpret_cast<int4*>(codes + r * code_stride),
             reinterpret_cast<const int4*>(remote), code_bytes / 16, lane);
    for (int b = lane; b < blocks; b += 32) scales[b * scale_stride + r] = remote[code_bytes + b];
  }
}

// The same pull for an FC1 that multiplies bf16 (MXFP8's dequantizing engine): row r's codes
// times their block's scale, as bf16 in row r of `rows` - exactly the values the codes stand
// for (quant/mx_format.cuh), so one byte per element crosses NVLink and two land in HBM. A
// lane takes 16 codes at a time; `block` (a multiple of 16) codes share a scale code. As in
// copy_row, kRowVecsInFlight vectors (and their scale codes) are loaded before the first is
// converted and stored: with one load in flight per lane the pull ran at 0.95 TB/s against
// the bf16 pull's 4.2 (docs/perf-log.md, MXFP8, 2026-12-04).
__global__ void pull_fp8_rows_dequantized_kernel(
    const int64_t* __restrict__ peer_bases, int64_t peer_offset,
    const int32_t* __restrict__ row_slot, const int32_t* __restrict__ num_rows, int64_t per_rank,
    int topk, int64_t row_bytes, int code_bytes, int cols, int block,
    __nv_bfloat16* __restrict__ rows, int64_t row_stride) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  const int n = *num_rows;
  const int vecs = (cols + 15) / 16;  // inside the padded codes
  for (int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; r < n;
       r += warps) {
    const uint8_t* remote = reinterpret_cast<const uint8_t*>(
        peer_row(peer_bases, peer_offset, row_slot[r], per_rank, topk, row_bytes));
    const int4* codes = reinterpret_cast<const int4*>(remote);
    const uint8_t* scales = remote + code_bytes;
    __nv_bfloat16* row = rows + r * row_stride;
    int c = lane;
    for (; c + 32 * (kRowVecsInFlight - 1) < vecs; c += 32 * kRowVecsInFlight) {
      int4 buf[kRowVecsInFlight];
      uint8_t scale[kRowVecsInFlight];
#pragma unroll
      for (int j = 0; j < kRowVecsInFlight; ++j) {
        buf[j] = codes[c + 32 * j];
        scale[j] = scales[(c + 32 * j) * 16 / block];
      }
#pragma unroll
      for (int j = 0; j < kRowVecsInFlight; ++j) {
        const int v = c + 32 * j;
        store_dequantized_codes(row + v * 16, buf[j], e8m0_factor(scale[j]), v * 16 + 8 < cols);
      }
    }
    for (; c < vecs; c += 32) {
      const int4 buf = codes[c];
      store_dequantized_codes(row + c * 16, buf, e8m0_factor(scales[c * 16 / block]),
                              c * 16 + 8 < cols);
    }
  }
}

__global__ void push_values_kernel(const int64_t* __restrict__ peer_bases, int64_t dst_offset,
                                   const int32_t* __restrict__ row_slot,
                                   const int32_t* __restrict__ num_rows, int64_t per_rank,
                                   const float* __restrict__ values) {
  const int rows = *num_rows;
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    const int64_t flat = row_slot[r];
    const int64_t dst = flat / per_rank;
    reinterpret_cast<float*>(peer_bases[dst] + dst_offset)[flat - dst * per_rank] = values[r];
  }
}

static int row_blocks() {
  return at::cuda::getCurrentDeviceProperties()->multiProcessorCount * kBlocksPerSm;
}

static void check_rows(const at::Tensor& row_slot, const at::Tensor& num_rows,
                       const at::Tensor& rows) {
  MOK_HOST_CHECK(row_slot.scalar_type() == at::kInt && num_rows.scalar_type() == at::kInt,
                 "row_slot and num_rows must be int32");
  MOK_HOST_CHECK(rows.is_contiguous() && rows.dim() == 2, "rows must be contiguous [cap, H]");
  MOK_HOST_CHECK(row_slot.numel() >= rows.size(0), "row_slot shorter than the row buffer");
  MOK_HOST_CHECK((rows.size(1) * rows.element_size()) % kRowBytesAlign == 0,
                 "row bytes must be a multiple of ", kRowBytesAlign);
  MOK_HOST_CHECK(reinterpret_cast<uintptr_t>(rows.data_ptr()) % kRowBytesAlign == 0,
                 "rows must be 16-byte aligned");
}

void pull_rows(const at::Tensor& peer_bases, int64_t src_offset, const at::Tensor& row_slot,
               const at::Tensor& num_rows, int64_t max_tokens, int64_t topk, at::Tensor& out) {
  check_rows(row_slot, num_rows, out);
  auto stream = at::cuda::getCurrentCUDAStream();
  move_rows_kernel<true><<<row_blocks(), kRowThreads, 0, stream>>>(
      peer_bases.data_ptr<int64_t>(), src_offset, row_slot.data_ptr<int32_t>(),
      num_rows.data_ptr<int32_t>(), max_tokens * topk, static_cast<int>(topk),
      out.size(1) * out.element_size(), static_cast<char*>(out.data_ptr()));
  MOK_LAUNCH_CHECK();
}

void pull_fp8_rows(const at::Tensor& peer_bases, int64_t src_offset, const at::Tensor& row_slot,
                   const at::Tensor& num_rows, int64_t max_tokens, int64_t topk,
                   int64_t row_bytes, int64_t code_bytes, at::Tensor& codes,
                   at::Tensor& scales) {
  MOK_HOST_CHECK(row_slot.scalar_type() == at::kInt && num_rows.scalar_type() == at::kInt,
                 "pull_fp8_rows: row_slot and num_rows must be int32");
  MOK_HOST_CHECK(codes.dim() == 2 && codes.element_size() == 1 && codes.stride(1) == 1 &&
                     codes.stride(0) >= code_bytes && codes.stride(0) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(codes.data_ptr()) % 16 == 0,
                 "pull_fp8_rows: codes must be one-byte [cap, H] with 16-byte aligned rows of "
                 "at least ", code_bytes, " bytes");
  const int64_t cap = codes.size(0), cols = codes.size(1);
  MOK_HOST_CHECK(row_slot.numel() >= cap, "pull_fp8_rows: row_slot shorter than the row buffer");
  MOK_HOST_CHECK(scales.dim() == 2 && scales.scalar_type() == at::kByte &&
                     scales.stride(1) == 1 && scales.size(1) >= cap &&
                     row_bytes >= code_bytes + scales.size(0) && code_bytes >= cols &&
                     code_bytes % 16 == 0 && row_bytes % 16 == 0,
                 "pull_fp8_rows: scales [", scales.size(0), ", ", scales.size(1), "] and wire "
                 "rows of ", row_bytes, " bytes (codes ", code_bytes, ") do not fit ", cap,
                 " rows of ", cols, " codes");
  if (cap == 0) return;
  auto stream = at::cuda::getCurrentCUDAStream();
  pull_fp8_rows_kernel<<<row_blocks(), kRowThreads, 0, stream>>>(
      peer_bases.data_ptr<int64_t>(), src_offset, row_slot.data_ptr<int32_t>(),
      num_rows.data_ptr<int32_t>(), max_tokens * topk, static_cast<int>(topk), row_bytes,
      static_cast<int>(code_bytes), static_cast<int>(scales.size(0)),
      static_cast<uint8_t*>(codes.data_ptr()), codes.stride(0), scales.data_ptr<uint8_t>(),
      scales.stride(0));
  MOK_LAUNCH_CHECK();
}

void pull_fp8_rows_dequantized(const at::Tensor& peer_bases, int64_t src_offset,
                               const at::Tensor& row_slot, const at::Tensor& num_rows,
                               int64_t max_tokens, int64_t topk, int64_t row_bytes,
                               int64_t code_bytes, int64_t block, at::Tensor& rows) {
  const char* what = "pull_fp8_rows_dequantized";
  MOK_HOST_CHECK(row_slot.scalar_type() == at::kInt && num_rows.scalar_type() == at::kInt, what,
                 ": row_slot and num_rows must be int32");
  MOK_HOST_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kBFloat16 && rows.stride(1) == 1 &&
                     rows.stride(0) % 8 == 0 && rows.size(1) % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(rows.data_ptr()) % 16 == 0,
                 what, ": rows must be bf16 [cap, H] with H and the row stride multiples of 8 "
                 "and 16-byte aligned rows, got ", rows.sizes(), " stride ", rows.stride(0));
  const int64_t cap = rows.size(0), cols = rows.size(1);
  MOK_HOST_CHECK(row_slot.numel() >= cap, what, ": row_slot shorter than the row buffer");
  check_wire_row(what, row_bytes, code_bytes, block, cols);
  if (cap == 0) return;
  auto stream = at::cuda::getCurrentCUDAStream();
  pull_fp8_rows_dequantized_kernel<<<row_blocks(), kRowThreads, 0, stream>>>(
      peer_bases.data_ptr<int64_t>(), src_offset, row_slot.data_ptr<int32_t>(),
      num_rows.data_ptr<int32_t>(), max_tokens * topk, static_cast<int>(topk), row_bytes,
      static_cast<int>(code_bytes), static_cast<int>(cols), static_cast<int>(block),
      reinterpret_cast<__nv_bfloat16*>(rows.data_ptr()), rows.stride(0));
  MOK_LAUNCH_CHECK();
}

void push_rows(const at::Tensor& peer_bases, int64_t dst_offset, const at::Tensor& row_slot,
               const at::Tensor& num_rows, int64_t slots_per_rank, const at::Tensor& rows) {
  check_rows(row_slot, num_rows, rows);
  auto stream = at::cuda::getCurrentCUDAStream();
  // The kernel only reads `rows` when pushing; its pointer type serves both directions.
  move_rows_kernel<false><<<row_blocks(), kRowThreads, 0, stream>>>(
      peer_bases.data_ptr<int64_t>(), dst_offset, row_slot.data_ptr<int32_t>(),
      num_rows.data_ptr<int32_t>(), slots_per_rank, 1, rows.size(1) * rows.element_size(),
      static_cast<char*>(const_cast<void*>(rows.data_ptr())));
  MOK_LAUNCH_CHECK();
}

void push_values(const at::Tensor& peer_bases, int64_t dst_offset, const at::Tensor& row_slot,
                 const at::Tensor& num_rows, int64_t slots_per_rank, const at::Tensor& values) {
  MOK_HOST_CHECK(values.scalar_type() == at::kFloat && values.is_contiguous(),
                 "values must be contiguous fp32");
  auto stream = at::cuda::getCurrentCUDAStream();
  push_values_kernel<<<row_blocks(), kRowThreads, 0, stream>>>(
      peer_bases.data_ptr<int64_t>(), dst_offset, row_slot.data_ptr<int32_t>(),
      num_rows.data_ptr<int32_t>(), slots_per_rank, values.data_ptr<float>());
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
