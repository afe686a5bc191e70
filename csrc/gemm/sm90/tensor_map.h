// Host side of TMA: tensor maps (CUtensorMap) for bf16 operands with 128-byte swizzle, and
// for MXFP8 weight codes.
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>

#include "config/kernel_config.cuh"

namespace mok::sm90 {

// A bf16 tensor of `dims` (innermost first) with byte `strides` for dims 1.. (dim 0 is
// contiguous), read in boxes of `box` elements; out-of-bounds elements read as zero.
// The innermost box extent must be 64 (one 128-byte swizzle row).
CUtensorMap make_bf16_tensor_map_4d(const void* base, const std::array<uint64_t, 4>& dims,
                                    const std::array<uint64_t, 3>& strides_bytes,
                                    const std::array<uint32_t, 4>& box);

// The engine's A operand: `rows` rows of `cols` bf16 (row stride `row_stride` elements), read
// in kGemmBlockM x kGemmBlockK boxes.
CUtensorMap row_tile_map(const void* base, uint64_t rows, uint64_t cols, uint64_t row_stride);

// The engine's B operand: expert weights W [E, halves * N, K] (strides in elements) viewed as
// [E, halves, N, K] and read in boxes of kGemmBlockN / halves rows x kGemmBlockK (or box_rows
// rows: the backward megakernel's 128-column FC2-dgrad tiles). A gated FC1 (halves = 2) loads
// its gate and up rows for the same output columns as two boxes.
CUtensorMap expert_weight_map(const void* base, uint64_t experts, uint64_t rows, uint64_t k,
                              uint64_t expert_stride, uint64_t row_stride, int halves,
                              uint32_t box_rows = 0);

// Rows the staged epilogue stores (gemm/sm90/tile_epilogue.cuh): `rows` rows of `halves` x
// `n_out` bf16 (row stride `row_stride` elements) viewed as [rows, halves, n_out], written in
// boxes of 64 rows (or box_rows) x 64 columns (128-byte swizzle) of one half, so a box never
// crosses from gate into up; box_cols 32: 64-byte swizzled boxes of 32 columns (sm90::
// StagedBox, for tiles of 96 output columns).
CUtensorMap staged_rows_map(const void* base, uint64_t rows, uint64_t n_out, int halves,
                            uint64_t row_stride, uint32_t box_rows = 0, uint32_t box_cols = 64);

// An MN-major operand read from rows: `rows` rows of `cols` bf16 (row stride `row_stride`
// elements), K = rows, read in boxes of 64 columns x kGemmBlockK rows (tile_engine.cuh:
// load_mn_boxes). Wgrad's operands: dY, act, dh and the token rows.
CUtensorMap mn_major_rows_map(const void* base, uint64_t rows, uint64_t cols,
                              uint64_t row_stride);

// Expert weights W [E, K, N] read MN-major (K = W's rows, N its contiguous columns) in boxes of
// 64 columns x kGemmBlockK rows: dgrad's B operand, the weight as stored (W2 [E, H, F] for
// dA = dY W2, W1 [E, F1, H] for dX = dh W1), no transposed copy.
CUtensorMap expert_weight_mn_map(const void* base, uint64_t experts, uint64_t k, uint64_t n,
                                 uint64_t expert_stride, uint64_t row_stride);

// MXFP8 weight codes W [E, halves * N, K] (one byte each; strides in bytes) read as
// expert_weight_map reads bf16 weights, unswizzled: a box row is kGemmBlockK bytes
// (gemm/sm90/mx_weight_stage.cuh dequantizes it into the swizzled bf16 tile).
CUtensorMap expert_weight_codes_map(const void* base, uint64_t experts, uint64_t rows,
                                    uint64_t k, uint64_t expert_stride, uint64_t row_stride,
                                    int halves);

// Their E8M0 scale codes [E, blocks, halves, padded_rows] (half_rows of each half used), read
// in boxes of one stage's worth: kGemmBlockN / halves rows x the blocks of kGemmBlockK.
CUtensorMap expert_weight_scales_map(const void* base, uint64_t experts, uint64_t blocks,
                                     int halves, uint64_t half_rows, uint64_t padded_rows);

// The FP8 engine's operands (gemm/fp8_grouped_gemm.cu), one byte per code, strides in bytes:
// A codes [rows, K] in kGemmBlockM x kFp8BlockK boxes and W codes [E, halves * N, K] in
// kFp8BlockN / halves x kFp8BlockK boxes, both 128-byte swizzled (a box row is one swizzle
// row); the A rows' E8M0 scale codes [k_blocks, rows] (row stride `row_stride`) in boxes of
// kFp8RowScaleBox rows of a stage's blocks, read from a 16-aligned row; MXFP8's bf16 weight
// column scales [E, k_blocks, halves, padded_rows] in boxes of one stage of one tile's half.
// blocks_per_stage must be the stage ring's kScaleBlocks: the box is what the stage's
// expected transaction bytes count (a larger box overruns the stage and its barriers).
CUtensorMap fp8_row_tile_map(const void* base, uint64_t rows, uint64_t k, uint64_t row_stride);
// tile_rows: the B tile's weight rows (kFp8BlockN, or kFp8WideBlockN for the wide tiles),
// a gated tile's halves one box each.
CUtensorMap fp8_expert_weight_map(const void* base, uint64_t experts, uint64_t rows, uint64_t k,
                                  uint64_t expert_stride, uint64_t row_stride, int halves,
                                  int tile_rows = kFp8BlockN);
// The same weights in boxes of half a B tile's rows (tile_rows / 2): a B tile as two boxes,
// one per CTA of a pair (fp8_mainloop.cuh: produce_fp8_tile_pair).
CUtensorMap fp8_expert_weight_half_map(const void* base, uint64_t experts, uint64_t rows,
                                       uint64_t k, uint64_t expert_stride, uint64_t row_stride,
                                       int halves, int tile_rows = kFp8BlockN);
CUtensorMap fp8_row_scales_map(const void* base, uint64_t k_blocks, uint64_t rows,
                               uint64_t row_stride, int blocks_per_stage);
// The same A codes [rows, K] as a store target: one consumer warpgroup's staged 64 rows of
// one 1 x kFp8ScaleBlock block per row, a 128-byte swizzled box (the forward megakernel's act
// under the blockwise recipe, megakernel/epilogue_storer.cuh).
CUtensorMap fp8_staged_codes_map(const void* base, uint64_t rows, uint64_t k,
                                 uint64_t row_stride);

}  // namespace mok::sm90
