"""Blockwise-FP8 expert weights, quantized once per optimizer step in both orientations and
cached across micro-batches by mxfp8_weights.layer_weights (the same invalidation rules):
E4M3 codes with one E8M0 (power-of-two) scale code per 128 x 128 block, what the FP8 grouped
GEMM reads (csrc/gemm/fp8_grouped_gemm.cu).

    forward  W1 [E, F1, H]    h   = Q(rows) W1^T        W2 [E, H, F]    out = Q(act) W2^T
    dgrad    W2^T [E, F, H]   dA  = Q(dY) W2            W1^T [E, H, F1] dX  = Q(dh) W1

A 128 x 128 block's scale does not depend on the orientation, so the dgrad weights are the
transposed codes and scales of one quantization (fp8_blockwise.py) - no second rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ops


@dataclass
class BlockWeight:
    codes: torch.Tensor  # float8_e4m3fn [E, N, K]
    scales: torch.Tensor  # uint8 E8M0 [E, ceil(N / 128), ceil(K / 128)]

    def transposed(self) -> "BlockWeight":
        """The other orientation: codes [E, K, N], rows padded to 16 bytes as the GEMM reads."""
        E, n, k = self.codes.shape
        codes = torch.empty(E, k, -(-n // 16) * 16, dtype=torch.uint8,
                            device=self.codes.device)[..., :n]
        codes.copy_(self.codes.view(torch.uint8).transpose(1, 2))
        return BlockWeight(codes.view(torch.float8_e4m3fn),
                           self.scales.transpose(1, 2).contiguous())


@dataclass
class Fp8BlockWeights:
    w1: BlockWeight  # FC1 [E, F1, H]
    w2: BlockWeight  # FC2 [E, H, F]
    w1_t: BlockWeight  # FC1-dgrad [E, H, F1]
    w2_t: BlockWeight  # FC2-dgrad [E, F, H]


def quantize_pair(w1: torch.Tensor, w2: torch.Tensor, gated: bool) -> Fp8BlockWeights:
    """Both orientations of a layer's stacked bf16 weights (`gated` changes nothing here: the
    GEMM reads a gated W1's gate and up rows as halves of the same codes)."""
    q1 = BlockWeight(*ops.fp8_quantize_weight_blocks(w1))
    q2 = BlockWeight(*ops.fp8_quantize_weight_blocks(w2))
    return Fp8BlockWeights(q1, q2, q1.transposed(), q2.transposed())
