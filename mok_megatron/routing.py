"""Routing formats and their validation.

Megatron's router hands a dense ``routing_map`` [T, E] (bool) and ``probs`` [T, E]; every
backend of this package takes the compact top-k form: expert ids [T, K] and probabilities
[T, K]. ``ids == -1`` marks an unused slot (a padding token, or a slot dropped by a capacity
factor); such a slot contributes nothing and receives a zero probability gradient.
"""

from __future__ import annotations

import torch

UNUSED_SLOT = -1


def topk_from_routing_map(routing_map: torch.Tensor, probs: torch.Tensor, topk: int):
    """Convert Megatron's dense routing to ids/probs [T, topk], deterministically.

    The selected experts of a token are listed in ascending expert order; a token with fewer
    than ``topk`` selected experts gets ``UNUSED_SLOT`` in its trailing slots. Gradients flow
    from the compact probs back into the dense ``probs``.
    """
    if routing_map.dim() != 2 or probs.shape != routing_map.shape:
        raise ValueError(
            f"routing_map and probs must both be [T, E]; got {tuple(routing_map.shape)} "
            f"and {tuple(probs.shape)}"
        )
    if routing_map.dtype != torch.bool:
        raise TypeError(f"routing_map must be torch.bool, got {routing_map.dtype}")
    num_experts = routing_map.shape[1]
    if not 1 <= topk <= num_experts:
        raise ValueError(f"topk must be in [1, {num_experts}], got {topk}")
    # Sort keys: selected experts first, each group in ascending expert order. The key is
    # unique per (row, expert), so the (unstable) sort result is still unique.
    expert_index = torch.arange(num_experts, device=routing_map.device)
    key = torch.where(routing_map, expert_index, expert_index + num_experts)
    order = torch.sort(key, dim=1).indices[:, :topk]
    selected = torch.gather(routing_map, 1, order)
    ids = torch.where(selected, order, torch.full_like(order, UNUSED_SLOT)).to(torch.int32)
    topk_probs = torch.gather(probs, 1, order) * selected.to(probs.dtype)
    return ids, topk_probs


def validate_routing(
    x: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, num_experts: int, *, check_values=True
) -> None:
    """Raise a clear error for malformed routing.

    Shape and dtype checks are free; value checks (range, NaN) read the tensors and therefore
    synchronize with the device, so the GPU path runs them only when asked to.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got shape {tuple(x.shape)}")
    if ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"expert ids must be [T, K] with T={x.shape[0]} (rows of x), got {tuple(ids.shape)}"
        )
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"expert ids must be int32 or int64, got {ids.dtype}")
    if probs.shape != ids.shape:
        raise ValueError(
            f"probs must have the shape of the expert ids {tuple(ids.shape)}, got "
            f"{tuple(probs.shape)}"
        )
    if not probs.is_floating_point():
        raise TypeError(f"probs must be a floating-point tensor, got {probs.dtype}")
    if ids.device != x.device or probs.device != x.device:
        raise ValueError(
            f"x, ids and probs must be on one device; got {x.device}, {ids.device}, {probs.device}"
        )
    if not check_values or ids.numel() == 0:
        return
    bad = (ids < UNUSED_SLOT) | (ids >= num_experts)
    if bool(bad.any()):
        t, k = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"expert id {int(ids[t, k])} at token {t}, slot {k} is out of range "
            f"[0, {num_experts}) (use {UNUSED_SLOT} for an unused slot)"
        )
    finite = torch.isfinite(probs)
    if not bool(finite.all()):
        t, k = (int(v) for v in (~finite).nonzero()[0])
        raise ValueError(f"probs[{t}, {k}] is {float(probs[t, k])}: probs must be finite")
