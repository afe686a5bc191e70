#!/bin/bash
# Session 22, call 4 (one H200): the remaining GPU suites that run the forward megakernel or
# its Python path (failure cases with the stall wrapper reading the launch's counters by
# name, the backward megakernel, Megatron's graph replay and MoELayer-vs-reference tests).
#   bash benchmarks/results/h200_mxfp8_megakernel/run4.sh
here=benchmarks/results/h200_mxfp8_megakernel
TESTS="test_failures:240 test_backward_megakernel:90 test_megatron_graph_replay:110 test_megatron_moe_layer_vs_reference:110" \
  MODELS="" bash $here/run1.sh
