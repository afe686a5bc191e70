// The backward megakernel's rounding tiles under the blockwise recipe (docs/fp8_blockwise.md
// has the reference; mok_megatron/cuda/operands.py says which GEMM reads which form): the role of
// mx_round_tile.cuh with blocks of 128 both ways. dY, x and dh go along K into the FP8
// engine's A operand (codes and transposed scale codes, buffers of their own) and along the
// rows into bf16 values in place; act only along the rows.
// A 128-row block along the rows is a whole m-block (m-blocks start at the expert's first row
// + 128 i), so its column maxima span both consumer warpgroups: the two run each unit of
// 128 rows x 128 columns together (quant/fp8_round_both_block.cuh, the separate path's
// both-forms pass's arithmetic, so both give the same bits), meeting at a named barrier of
// their 256 threads, with the unit's column maxima in the first consumer's staging buffer.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "config/kernel_config.cuh"
#include "gemm/sm90/tma.cuh"
#include "quant/fp8_round_both_block.cuh"
#include "quant/mx_round_span.cuh"

namespace mok {

static_assert(kRoundCols % kWideBlock == 0 && kWideThreads == 128 * kGemmConsumers &&
                  kGemmBlockM == kWideBlock,
              "a rounding tile is whole units of an m-block's rows, one per thread of the "
              "consumer warpgroups");

// Both consumer warpgroups (t: 0..255 over them; barrier_id: theirs) call it together, after
// every earlier use of `scratch` is done: rows [row0, row0 + rows_valid) of src [.., cols]
// (rows_valid <= 128), columns [col0, col0 + kRoundCols). kAlongK: codes along K into
// along_k, else along the rows only.
template <bool kAlongK>
__device__ __forceinline__ void fp8_round_tile_rows(__nv_bfloat16* src, const Fp8Rows& along_k,
                                                    int cols, int64_t row0, int rows_valid,
                                                    int col0, WideColumnMaxima& scratch, int t,
                                                    int barrier_id) {
  const int vecs = cols / 8;
  const MatrixRows rows{reinterpret_cast<const int4*>(src), vecs};
  const int span_end = min((col0 + kRoundCols) / kWideBlock, (cols + kWideBlock - 1) / kWideBlock);
  for (int span = col0 / kWideBlock; span < span_end; ++span) {
    fp8_round_both_block<kAlongK>(rows, row0, rows_valid, span, vecs, along_k,
                                  reinterpret_cast<int4*>(src), scratch, t,
                                  [&] { sm90::named_barrier_sync(barrier_id, kWideThreads); });
  }
}

}  // namespace mok
