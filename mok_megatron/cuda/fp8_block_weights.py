"""Blockwise-FP8 expert weights, quantized once per optimizer step in both orientations and
cached across micro-batches by mxfp8_weights.layer_weights (the same invalidation rules;
refreshed in place, so a CUDA graph that captured a layer reads the refreshed codes, and under
capture only when the weights changed - quantize_pair's `into` and `only_if`):
E4M3 codes with one E8M0 (power-of-two) scale code per 128 x 128 block, what the FP8 grouped
GEMM reads (csrc/gemm/fp8_grouped_gemm.cu).

    forward  W1 [E, F1, H]    h   = Q(rows) W1^T        W2 [E, H, F]    out = Q(act) W2^T
    dgrad    W2^T [E, F, H]   dA  = Q(dY) W2            W1^T [E, H, F1] dX  = Q(dh) W1

A 128 x 128 block's scale does not depend on the orientation, so the dgrad weights are the
transposed codes and scales of one quantization (fp8_blockwise.py) - no second rounding: the
quantizer writes both orientations from one read of the weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import mxfp8_weights, ops


@dataclass
class BlockWeight:
    codes: torch.Tensor  # float8_e4m3fn [E, N, K], rows padded to 16 bytes
    scales: torch.Tensor  # uint8 E8M0 [E, ceil(N / 128), ceil(K / 128)]


@dataclass
class Fp8BlockWeights:
    w1: BlockWeight  # FC1 [E, F1, H]
    w2: BlockWeight  # FC2 [E, H, F]
    w1_t: BlockWeight  # FC1-dgrad [E, H, F1]
    w2_t: BlockWeight  # FC2-dgrad [E, F, H]


def _both_orientations(w: torch.Tensor, into: Optional[tuple], only_if: Optional[torch.Tensor]):
    out = None if into is None else (into[0].codes, into[0].scales, into[1].codes,
                                     into[1].scales)
    codes, scales, codes_t, scales_t = ops.fp8_quantize_weight_blocks(
        w, transposed=True, out=out, only_if=only_if)
    return BlockWeight(codes, scales), BlockWeight(codes_t, scales_t)


def quantize_pair(w1: torch.Tensor, w2: torch.Tensor, gated: bool,
                  into: Optional[Fp8BlockWeights] = None,
                  only_if: Optional[torch.Tensor] = None) -> Fp8BlockWeights:
    """Both orientations of a layer's stacked bf16 weights, one launch per weight (`gated`
    changes nothing here: the GEMM reads a gated W1's gate and up rows as halves of the same
    codes). `into`: an earlier result for these shapes, refreshed in place; `only_if`: see
    ops.fp8_quantize_weight_blocks."""
    q1, q1_t = _both_orientations(w1, None if into is None else (into.w1, into.w1_t), only_if)
    q2, q2_t = _both_orientations(w2, None if into is None else (into.w2, into.w2_t), only_if)
    return Fp8BlockWeights(q1, q2, q1_t, q2_t)


mxfp8_weights.refreshes_in_place(quantize_pair)
