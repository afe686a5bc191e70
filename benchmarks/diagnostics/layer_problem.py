"""One MoE layer's no-grad forward on one GPU (EP=1, CUDA backend) for the single-GPU tracing
and profiling scripts: x, top-k ids over `experts` experts, probs and stacked FC1/FC2 weights
of a model shape, and a recipe with the given precision and forward kernel."""

from __future__ import annotations

from typing import Callable

import torch

from mok_megatron.config import KernelKnobs, Recipe
from mok_megatron.functional import moe_experts


def one_gpu_forward(model, experts: int, tokens: int, forward_kernel: str, comm_sms: int,
                    seed: int = 0, precision: str = "bf16") -> Callable[[], torch.Tensor]:
    H, F, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, H, device="cuda", generator=g).bfloat16()
    ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(K, dim=1).indices
    probs = torch.rand(tokens, K, device="cuda", generator=g)
    w1 = (torch.randn(experts, 2 * F, H, device="cuda", generator=g) * H**-0.5).bfloat16()
    w2 = (torch.randn(experts, H, F, device="cuda", generator=g) * F**-0.5).bfloat16()
    recipe = Recipe(name="one_gpu", backend="cuda", precision=precision,
                    kernel=KernelKnobs(max_tokens_per_rank=tokens, forward_kernel=forward_kernel,
                                       comm_sms_forward=comm_sms))

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return moe_experts(x, ids, probs, w1, w2, group=None, activation="swiglu",
                               recipe=recipe)

    return forward
