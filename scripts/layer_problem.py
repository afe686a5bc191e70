"""One MoE layer's inputs on one GPU (EP=1) for the single-GPU tracing and profiling scripts:
x, top-k ids over `experts` experts, probs, and stacked FC1/FC2 weights of a model shape."""

from __future__ import annotations

import torch


def one_gpu_layer(model, experts: int, tokens: int, seed: int = 0):
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, H, device="cuda", generator=g).bfloat16()
    ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(K, dim=1).indices
    probs = torch.rand(tokens, K, device="cuda", generator=g)
    w1 = (torch.randn(experts, 2 * F, H, device="cuda", generator=g) * H**-0.5).bfloat16()
    w2 = (torch.randn(experts, H, F, device="cuda", generator=g) * F**-0.5).bfloat16()
    return x, ids, probs, w1, w2
