"""The PyTorch-facing MoE API: dispatch -> experts -> combine as one differentiable call.

    y = moe_experts(x, ids, probs, w1, w2, group=ep_group, activation="swiglu", recipe=recipe)

Arguments and semantics are those of ``reference.moe_reference`` (without the shared expert,
which Megatron computes itself). The backend comes from ``recipe.backend``:
  - ``reference``: plain PyTorch, any device, any torch.distributed backend;
  - ``cuda``: the compiled kernels over symmetric memory (GPU tensors, NCCL group);
  - ``auto``: ``cuda`` for GPU tensors and ``reference`` for CPU tensors. A GPU tensor never
    falls back to the (much slower) reference silently: if the extension is missing, or the
    recipe's precision has no CUDA kernels yet (config.CUDA_PRECISIONS), the call fails and
    says how to build it or to choose ``backend: reference`` explicitly.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .config import CUDA_PRECISIONS, Recipe, no_cuda_kernels
from .inputs import Weights, check_call, check_routing_values
from .reference.moe import reference_forward


def resolve_backend(recipe: Recipe, device: torch.device) -> str:
    backend = recipe.backend
    if backend == "auto":
        backend = "cuda" if device.type == "cuda" else "reference"
    if backend == "cuda" and device.type != "cuda":
        raise ValueError(f"backend 'cuda' needs CUDA tensors, got tensors on {device}")
    if backend == "cuda" and recipe.precision not in CUDA_PRECISIONS:
        raise NotImplementedError(no_cuda_kernels(recipe))
    return backend


def moe_experts(
    x: torch.Tensor,
    ids: torch.Tensor,
    probs: torch.Tensor,
    w1: Weights,
    w2: Weights,
    *,
    group: Optional[dist.ProcessGroup] = None,
    activation: str = "swiglu",
    recipe: Optional[Recipe] = None,
    accumulate_main_grad: bool = False,
) -> torch.Tensor:
    """`accumulate_main_grad` (Megatron's gradient_accumulation_fusion): where the weights carry
    fp32 ``main_grad`` tensors, the cuda backend's backward (either kernel path) adds the
    weight gradients into them in place and autograd gets Megatron's placeholders (main_grad.py);
    elsewhere, and on the reference backend, the gradients go through autograd."""
    recipe = recipe or Recipe()
    world = 1 if group is None else dist.get_world_size(group)
    # Validated once, here; every step after this point trusts the call.
    call = check_call(x, ids, probs, w1, w2, activation=activation, world=world)
    backend = resolve_backend(recipe, x.device)
    if backend == "reference" or recipe.kernel.check_inputs:
        check_routing_values(call)  # reads the tensors: a host synchronization
    if backend == "reference":
        return reference_forward(call, group, precision=recipe.precision)
    from .cuda.symm_moe import moe_experts_cuda

    return moe_experts_cuda(call, group, recipe, accumulate_main_grad)
