// The Python module mok_megatron._C: one block per area, each op checked again in
// mok_megatron/cuda/ops.py before it gets here.
#include <torch/extension.h>

#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mok_megatron CUDA kernels (sm_90a)";

  // comm: barrier and row movers over symmetric memory
  m.def("peer_barrier", &mok::peer_barrier);
  m.def("stall_for_test", &mok::stall_for_test);
  m.def("publish_inputs", &mok::publish_inputs);
  m.def("pull_rows", &mok::pull_rows);
  m.def("pull_fp8_rows", &mok::pull_fp8_rows);
  m.def("pull_fp8_rows_dequantized", &mok::pull_fp8_rows_dequantized);
  m.def("push_rows", &mok::push_rows);
  m.def("push_values", &mok::push_values);

  // schedule
  m.def("build_schedule", &mok::build_schedule);
  m.def("check_routing_map", &mok::check_routing_map);

  // epilogues
  m.def("activation_forward", &mok::activation_forward);
  m.def("activation_backward", &mok::activation_backward);
  m.def("reduce_slots", &mok::reduce_slots);
  m.def("gather_slot_values", &mok::gather_slot_values);

  // MXFP8 operand rounding
  m.def("mx_round_columns", &mok::mx_round_columns);
  m.def("mx_round_segments", &mok::mx_round_segments);
  m.def("mx_quantize_segments", &mok::mx_quantize_segments);
  m.def("mx_dequantize_segments", &mok::mx_dequantize_segments);
  m.def("mx_round_both", &mok::mx_round_both);
  m.def("pull_rows_mx_round_both", &mok::pull_rows_mx_round_both);
  m.def("fp8_quantize_round_both", &mok::fp8_quantize_round_both);
  m.def("pull_rows_fp8_quantize_round_both", &mok::pull_rows_fp8_quantize_round_both);
  m.def("mx_quantize_columns", &mok::mx_quantize_columns);
  m.def("mx_quantize_rows_transposed", &mok::mx_quantize_rows_transposed);
  m.def("quantize_wire_rows", &mok::quantize_wire_rows);
  m.def("fp8_quantize_weight_blocks", &mok::fp8_quantize_weight_blocks);
  m.def("fp8_grouped_gemm", &mok::fp8_grouped_gemm);

  // grouped GEMM tile engine
  m.def("grouped_gemm", &mok::grouped_gemm);
  m.def("grouped_wgrad_accumulate", &mok::grouped_wgrad_accumulate);
  m.def("timeout_reports", &mok::timeout_reports);

  // megakernels
  m.def("moe_forward_megakernel", &mok::moe_forward_megakernel);
  m.def("moe_backward_megakernel", &mok::moe_backward_megakernel);
}
