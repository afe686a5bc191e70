// Host launchers of the v1 GPU path, one group per job. Every launcher runs on the current
// CUDA stream and never synchronizes with the host; sizes that only the GPU knows (how many
// rows an expert received) are read by the kernels from device memory.
#pragma once

#include <torch/extension.h>

#include "gemm/timeout_report.h"

namespace mok {

// comm/barrier.cu
void peer_barrier(const at::Tensor& peer_bases, int64_t flags_offset, at::Tensor& epochs,
                  int64_t channel, int64_t rank, int64_t world, int64_t timeout_ns,
                  int64_t stage);
void stall_for_test(at::Tensor& flag, int64_t rank, int64_t timeout_ns);

// schedule/build_schedule.cu
void build_schedule(const at::Tensor& peer_bases, int64_t ids_offset, int64_t probs_offset,
                    int64_t count_offset, int64_t world, int64_t max_tokens, int64_t topk,
                    int64_t expert_begin, const at::Tensor& expert_position, at::Tensor& offsets,
                    at::Tensor& row_slot, at::Tensor& row_prob);

// comm/publish.cu: x (unless rows is false), ids, probs and the token count into this rank's
// workspace regions (byte offsets into buffer); ids32 receives the int32 ids too.
void publish_inputs(const at::Tensor& x, const at::Tensor& ids, const at::Tensor& probs,
                    at::Tensor& buffer, int64_t tokens_offset, int64_t ids_offset,
                    int64_t probs_offset, int64_t count_offset, at::Tensor& ids32, bool rows);

// comm/rows.cu
void pull_rows(const at::Tensor& peer_bases, int64_t src_offset, const at::Tensor& row_slot,
               const at::Tensor& num_rows, int64_t max_tokens, int64_t topk, at::Tensor& out);
void pull_fp8_rows(const at::Tensor& peer_bases, int64_t src_offset, const at::Tensor& row_slot,
                   const at::Tensor& num_rows, int64_t max_tokens, int64_t topk,
                   int64_t row_bytes, int64_t code_bytes, at::Tensor& codes,
                   at::Tensor& scales);
// The same wire rows as bf16 values (codes times their block's scale; block: codes per scale
// code), for an FC1 that multiplies bf16.
void pull_fp8_rows_dequantized(const at::Tensor& peer_bases, int64_t src_offset,
                               const at::Tensor& row_slot, const at::Tensor& num_rows,
                               int64_t max_tokens, int64_t topk, int64_t row_bytes,
                               int64_t code_bytes, int64_t block, at::Tensor& rows);
void push_rows(const at::Tensor& peer_bases, int64_t dst_offset, const at::Tensor& row_slot,
               const at::Tensor& num_rows, int64_t slots_per_rank, const at::Tensor& rows);
void push_values(const at::Tensor& peer_bases, int64_t dst_offset, const at::Tensor& row_slot,
                 const at::Tensor& num_rows, int64_t slots_per_rank, const at::Tensor& values);

// epilogue/activation.cu
void activation_forward(const at::Tensor& h, const at::Tensor& row_prob,
                        const at::Tensor& num_rows, int64_t activation, at::Tensor& out);
void activation_backward(const at::Tensor& h, const at::Tensor& grad_out,
                         const at::Tensor& row_prob, const at::Tensor& num_rows,
                         int64_t activation, at::Tensor& grad_h, at::Tensor& act_out,
                         at::Tensor& grad_prob);

// epilogue/reduce_slots.cu
void reduce_slots(const at::Tensor& slots, const at::Tensor& ids, at::Tensor& out);
void gather_slot_values(const at::Tensor& values, const at::Tensor& ids, at::Tensor& out);

// quant/mx_round.cu: MXFP8-rounded copies of a GEMM operand (dequantized to bf16, exact),
// blocks along the columns of each row (the first *num_rows rows, or all) or along the rows
// of each segment (offsets [segments + 1] on the device, or every segment_rows rows).
void mx_round_columns(const at::Tensor& x, const c10::optional<at::Tensor>& num_rows,
                      at::Tensor& out);
void mx_round_segments(const at::Tensor& x, const c10::optional<at::Tensor>& offsets,
                       int64_t segment_rows, int64_t block, at::Tensor& out);
// quant/segment_codes.cu: the same blocks along the rows of each segment kept as E4M3 codes
// [rows, cols] and E8M0 scale codes [row blocks, cols] (saved rows for wgrad), and back to the
// bf16 values mx_round_segments writes.
void mx_quantize_segments(const at::Tensor& x, const at::Tensor& offsets, int64_t block,
                          at::Tensor& codes, at::Tensor& scales);
void mx_dequantize_segments(const at::Tensor& codes, const at::Tensor& scales,
                            const at::Tensor& offsets, int64_t block, at::Tensor& out);
// quant/mx_round_both.cu: both of those at once (blocks along the columns of each row into
// along_k, along the rows of each segment into along_n), of x or of the schedule's rows pulled
// from the peers' bf16 token rows at src_offset; rows outside every segment are not written.
// The fp8_ forms: the blockwise recipe's, blocks of 128 both ways, along the columns as E4M3
// codes [rows, cols] and transposed E8M0 scale codes [blocks, >= rows] (the FP8 GEMM's A).
void mx_round_both(const at::Tensor& x, const at::Tensor& offsets, at::Tensor& along_k,
                   at::Tensor& along_n);
void pull_rows_mx_round_both(const at::Tensor& peer_bases, int64_t src_offset,
                             const at::Tensor& row_slot, const at::Tensor& offsets,
                             int64_t max_tokens, int64_t topk, at::Tensor& along_k,
                             at::Tensor& along_n);
void fp8_quantize_round_both(const at::Tensor& x, const at::Tensor& offsets, at::Tensor& codes,
                             at::Tensor& scales, at::Tensor& along_n);
void pull_rows_fp8_quantize_round_both(const at::Tensor& peer_bases, int64_t src_offset,
                                       const at::Tensor& row_slot, const at::Tensor& offsets,
                                       int64_t max_tokens, int64_t topk, at::Tensor& codes,
                                       at::Tensor& scales, at::Tensor& along_n);
// The same blocks as E4M3 codes and E8M0 scale codes in the MXFP8 GEMMs' layout
// (gemm/sm90/mx_weight_stage.cuh: [E, blocks, halves, rows of a half padded]): along columns,
// x's rows (the first *num_rows, or all) as matrices of matrix_rows rows in `halves` halves,
// codes [rows, cols] (rows 16-byte aligned), blocks of `block` (32 or 128); along the rows of each matrix of w [E, r, c], codes [E, c, r] transposed.
void mx_quantize_columns(const at::Tensor& x, const c10::optional<at::Tensor>& num_rows,
                         at::Tensor& codes, at::Tensor& scales, int64_t matrix_rows,
                         int64_t halves, int64_t block);
void mx_quantize_rows_transposed(const at::Tensor& w, at::Tensor& codes, at::Tensor& scales);
// x [T, H] as the wire rows a rank publishes under an FP8 recipe (comm/rows.cu's
// pull_fp8_rows reads them): row t at buffer + offset + t * row_bytes, its E4M3 codes in the
// first code_bytes, then its scale codes, one per `block` of the row.
void quantize_wire_rows(const at::Tensor& x, at::Tensor& buffer, int64_t offset,
                        int64_t row_bytes, int64_t code_bytes, int64_t block);

// quant/block_quantize.cu: a stacked weight w [E, N, K] as E4M3 codes with one E8M0 scale
// code per 128 x 128 block, scales [E, ceil(N / 128), ceil(K / 128)] (the blockwise recipe).
void fp8_quantize_weight_blocks(const at::Tensor& w, at::Tensor& codes, at::Tensor& scales,
                                const c10::optional<at::Tensor>& codes_t,
                                const c10::optional<at::Tensor>& scales_t,
                                const c10::optional<at::Tensor>& only_if);

// gemm/fp8_grouped_gemm.cu (FP8 engine, blockwise recipe): A codes [rows, K] with E8M0 scale
// codes [ceil(K / 128), >= rows] per 1 x 128, W codes [E, N, K] with E8M0 codes per 128 x 128
// block; epilogue and arguments as grouped_gemm's. stages: the ring's depth (0: the deepest
// that fits); m_group: m-blocks per group of the tile order (0: the config's); cluster_ctas:
// 1, or 2 for CTA pairs sharing weight tiles by multicast; block_n: the tiles' columns, 0 or
// 128, or 192 (plain epilogue, one CTA per tile, 4 stages); the same bits.
void fp8_grouped_gemm(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& w,
                      const at::Tensor& w_scales, const at::Tensor& offsets,
                      const c10::optional<at::Tensor>& row_prob, int64_t activation,
                      at::Tensor& out, const c10::optional<at::Tensor>& h_out,
                      int64_t timeout_ns, int64_t rank, int64_t stages, int64_t m_group,
                      int64_t cluster_ctas, int64_t block_n);

// gemm/grouped_gemm.cu (sm90 tile engine). activation: -1 = plain store, else ActivationId
// with row_prob folded in; h_out (optional) receives the bf16 pre-activation. rank: the EP
// rank launching it, which names its timeout report (gemm/timeout_report.h). With w_scales,
// W holds MXFP8 codes (float8_e4m3fn) and w_scales their E8M0 scales [E, N, ceil(K / 32)].
// m_group: m-blocks per group of the tile order (0: kEngineTileGroupMBlocks; the same bits).
void grouped_gemm(const at::Tensor& a, const at::Tensor& w, const at::Tensor& offsets,
                  const c10::optional<at::Tensor>& row_prob, int64_t activation, at::Tensor& out,
                  const c10::optional<at::Tensor>& h_out,
                  const c10::optional<at::Tensor>& w_scales, int64_t timeout_ns, int64_t rank,
                  int64_t m_group);

// schedule/routing_map_check.cu: a routing map [T, E] (bool) with more than topk experts
// selected for a token stops with a report naming the token (no host sync). rank: named by
// the report.
void check_routing_map(const at::Tensor& routing_map, int64_t topk, int64_t rank);

// gemm/grouped_wgrad.cu (sm90 tile engine): grads[e] += A[rows of e]^T B[rows of e] for A
// [rows, M], B [rows, N] bf16, grads an int64 address per expert of a row-major fp32 [M, N]
// (Megatron's main_grad), each element added once: the separate backward's weight gradients
// under gradient-accumulation fusion.
void grouped_wgrad_accumulate(const at::Tensor& a, const at::Tensor& b,
                              const at::Tensor& offsets, const at::Tensor& grads, int64_t m_dim,
                              int64_t n_dim, int64_t timeout_ns, int64_t rank);

// megakernel/moe_forward.cu: pull-dispatch + FC1/activation + FC2 + push-combine in one
// persistent launch. precision "mxfp8": act is rounded to MXFP8 along F before FC2 reads it,
// and the published rows are FP8 wire rows (wire_row_bytes, wire_code_bytes, wire_block:
// comm/wire_row.cuh) the pull dequantizes (wire_row_bytes 0 under bf16); the weights are bf16
// (under mxfp8 their MXFP8 values) or, with w1_scales and w2_scales, MXFP8 codes
// (gemm/mx_weight_checks.h). "fp8_blockwise": the pull copies the wire rows' codes into rows
// (E4M3 codes) and their scale codes into rows_scales, act is E4M3 codes with act_scales, the
// weights are blockwise codes with their 128 x 128 block scales, every GEMM the FP8 engine's
// (h_out, profiling variants and traces refused). counters: int32 zeros
// (ops.megakernel_counters sizes them). h_out
// (optional) receives FC1's output for backward. minibatch_rows: rows the pull publishes at
// once. ring_mblocks > 0: rows and act are a ring of
// ring_slots macrobatches of ring_mblocks m-blocks (megakernel/macrobatch_ring.cuh). trace
// (optional): int64 [SMs, kTraceBlockValues] receiving timestamps (megakernel/tile_trace.cuh).
void moe_forward_megakernel(const at::Tensor& peer_bases, int64_t tokens_offset,
                            int64_t slots_offset, const at::Tensor& offsets,
                            const at::Tensor& row_slot, const at::Tensor& row_prob,
                            int64_t max_tokens, int64_t topk, const at::Tensor& w1,
                            const at::Tensor& w2, const c10::optional<at::Tensor>& w1_scales,
                            const c10::optional<at::Tensor>& w2_scales,
                            const std::string& precision, int64_t wire_row_bytes,
                            int64_t wire_code_bytes, int64_t wire_block, int64_t activation,
                            at::Tensor& rows, at::Tensor& act,
                            const c10::optional<at::Tensor>& rows_scales,
                            const c10::optional<at::Tensor>& act_scales,
                            const c10::optional<at::Tensor>& h_out,
                            at::Tensor& counters, int64_t comm_blocks, int64_t minibatch_rows,
                            int64_t ring_mblocks, int64_t ring_slots, int64_t timeout_ns,
                            int64_t rank, int64_t profile_skip,
                            const c10::optional<at::Tensor>& trace);

// megakernel/moe_backward.cu: pull dY (and x, recomputing) + FC1 again (recomputing) +
// FC2-dgrad/activation backward + dW2 + FC1-dgrad with dX rows and dprobs pushed to their
// slots + dW1 in one persistent launch. ring_mblocks == 0: rows, h, act are what forward kept,
// at schedule positions; > 0: the inputs are recomputed and every row buffer (rows, h, act,
// dout, dh, dprob_part) is a ring of ring_slots macrobatches of ring_mblocks m-blocks
// (megakernel/macrobatch_ring.cuh), with carry (fp32) holding weight-gradient tiles between
// macrobatches. Each weight gradient is bf16 (dw1 / dw2, stacked) or added into fp32 tensors
// whose addresses dw1_fp32 / dw2_fp32 list per expert. counters: int32 zeros
// (ops.backward_megakernel_counters sizes them, and ops.backward_carry the carry). trace
// (optional): int64 [SMs, BackwardTrace::kBlockValues] receiving timestamps
// (megakernel/backward_trace.cuh).
void moe_backward_megakernel(const at::Tensor& peer_bases, int64_t tokens_offset,
                             int64_t inputs_offset, int64_t slots_offset, int64_t values_offset,
                             const at::Tensor& offsets, const at::Tensor& row_slot,
                             const at::Tensor& row_prob, int64_t max_tokens, int64_t topk,
                             const at::Tensor& w1, const at::Tensor& w2, int64_t activation,
                             at::Tensor& rows, at::Tensor& h, at::Tensor& act, at::Tensor& dout,
                             at::Tensor& dh, at::Tensor& dprob_part,
                             const c10::optional<at::Tensor>& dw1,
                             const c10::optional<at::Tensor>& dw2,
                             const c10::optional<at::Tensor>& dw1_fp32,
                             const c10::optional<at::Tensor>& dw2_fp32,
                             const c10::optional<at::Tensor>& carry,
                             const c10::optional<at::Tensor>& w1_t,
                             const c10::optional<at::Tensor>& w2_t,
                             const c10::optional<at::Tensor>& rows_k,
                             const c10::optional<at::Tensor>& dout_k,
                             const c10::optional<at::Tensor>& dh_k,
                             const std::vector<at::Tensor>& fp8_scales, at::Tensor& counters,
                             int64_t comm_blocks, int64_t minibatch_rows, int64_t ring_mblocks,
                             int64_t ring_slots, int64_t timeout_ns, int64_t rank,
                             const c10::optional<at::Tensor>& trace);

}  // namespace mok
