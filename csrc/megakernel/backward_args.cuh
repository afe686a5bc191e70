// The backward megakernel's launch arguments (megakernel/moe_backward.cu): its TMA maps and
// its pointers and sizes, shared by the kernel and its storer warps
// (megakernel/backward_storer.cuh).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "megakernel/backward_tiles.cuh"
#include "quant/fp8_rows.h"

namespace mok {

struct BackwardMaps {
  CUtensorMap rows_k;      // x rows [buffer rows, H], K-major A of the FC1 recompute (kMx:
                           // rows_k, rounded along H; kFp8: rows_k's codes)
  CUtensorMap w1_k;        // W1 [E, F1, H] as forward reads it (gate | up halves): its B
                           // (kFp8: its codes)
  CUtensorMap act_store;   // act [buffer rows, F]: the FC1 recompute's stores
  CUtensorMap dout_rows;   // dY rows [buffer rows, H], K-major A of FC2-dgrad (kMx: dout_k;
                           // kFp8: dout_k's codes)
  CUtensorMap w2_dgrad;    // B of FC2-dgrad: W2 [E, H, F] N-major (kMx: W2^T [E, F, H] K-major;
                           // kFp8: its codes)
  CUtensorMap h_tile;      // h [buffer rows, (2,) F]: FC1's stores
  CUtensorMap h_part;      // h again in boxes of kDgrad2PartRows rows: FC2-dgrad's loads
  CUtensorMap dh_part;     // dh [buffer rows, (2,) F] in the same boxes: its stores
  CUtensorMap dh_rows;     // dh [buffer rows, F1], K-major A of FC1-dgrad (kMx: dh_k;
                           // kFp8: dh_k's codes)
  CUtensorMap w1_dgrad;    // B of FC1-dgrad: W1 [E, F1, H] N-major (kMx: W1^T [E, H, F1];
                           // kFp8: its codes)
  CUtensorMap rows_k_scales;  // kFp8: the scale codes of rows_k, dout_k and dh_k
  CUtensorMap dout_k_scales;  // ([block][row], a stage's box of rows)
  CUtensorMap dh_k_scales;
  CUtensorMap dout_mn;     // dY rows, MN-major A of dW2
  CUtensorMap act_mn;      // act [buffer rows, F], MN-major B of dW2
  CUtensorMap dh_mn;       // dh, MN-major A of dW1
  CUtensorMap rows_mn;     // x rows [buffer rows, H], MN-major B of dW1
  CUtensorMap dw2_store;   // bf16 dW2 [E * H, F] (unused when accumulating into fp32)
  CUtensorMap dw1_store;   // bf16 dW1 [E * F1, H]
};

struct BackwardArgs {
  const int64_t* peer_bases;  // [world] address of each rank's workspace
  int64_t tokens_offset;      // byte offset of the published dY rows [max_tokens, H]
  int64_t inputs_offset;      // byte offset of the published x rows (recomputed inputs)
  int64_t slots_offset;       // byte offset of the combine slots [max_tokens * topk, H]
  int64_t values_offset;      // byte offset of the slot values [max_tokens * topk] fp32
  const int32_t* offsets;     // [E + 1] expert row ranges of the schedule
  const int32_t* row_slot;    // [rows] flat (source, token, k) of each row
  const float* row_prob;      // [rows]
  int num_experts, hidden, ffn, f1, per_rank, topk, comm_blocks, world;
  int ring_mblocks, ring_slots;  // recomputed inputs: the ring (macrobatch_ring.cuh); else 0
  __nv_bfloat16* rows;        // [buffer rows, H] x rows: forward's, or pulled here
  __nv_bfloat16* h;           // [buffer rows, F1]: forward's, or FC1's here
  __nv_bfloat16* act;         // [buffer rows, F]
  __nv_bfloat16* dout;        // [buffer rows, H] pulled dY rows
  __nv_bfloat16* dh;          // [buffer rows, F1]
  __nv_bfloat16* rows_k;      // kMx: [buffer rows, H] x rows rounded along H, else null
  __nv_bfloat16* dout_k;      // kMx: [buffer rows, H] dY rows rounded along H
  __nv_bfloat16* dh_k;        // kMx: [buffer rows, F1] dh rounded along F1
  // kFp8: the same three along K as codes and scale codes, and the weights' E8M0
  // codes per 128 x 128 block ([E, row blocks, k blocks] of W1, W2^T, W1^T as read).
  Fp8Rows rows_fp8, dout_fp8, dh_fp8;
  const uint8_t* w1_block_scales;
  const uint8_t* w2_t_block_scales;
  const uint8_t* w1_t_block_scales;
  float* dprob_part;          // [buffer rows, F / kDgrad2Cols] per-row dprob partials
  __nv_bfloat16* dw1;         // [E, F1, H] bf16 gradient, or null: dw1_fp32
  __nv_bfloat16* dw2;         // [E, H, F]
  const int64_t* dw1_fp32;    // [E] addresses of fp32 [F1, H] gradients added into, or null
  const int64_t* dw2_fp32;    // [E] of fp32 [H, F]
  float* carry;               // [ring_slots + 1, wgrad tiles, consumers, kCarryFloats] or null
  // Per BackwardProgress kind (backward_tiles.cuh; the MXFP8 kinds null under BF16): its count
  // per m-block (rows pulled, or tile halves - one per consumer warpgroup - stored) and per
  // macrobatch.
  uint32_t* per_mblock[kProgressKinds];
  uint32_t* per_macro[kProgressKinds];
  uint32_t* macro_done;       // [macrobatches] tile halves done (the ring's slot reuse)
  uint32_t* carry_ready;      // [macrobatches, wgrad tiles, consumers] carries stored
  uint32_t* tile_counter;     // [1] tiles handed out
  uint32_t* arrivals;         // [1] blocks started (their tickets)
  int minibatch_rows;         // rows the pull publishes at once
  uint64_t timeout_ns;
  int* report;
  int64_t* trace;             // [grid, BackwardTrace::kBlockValues] timestamps
                              // (backward_trace.cuh), or null
};

}  // namespace mok
