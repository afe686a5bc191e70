"""Routing formats and their validation.

Megatron's router hands a dense ``routing_map`` [T, E] (bool) and ``probs`` [T, E]; every
backend of this package takes the compact top-k form: expert ids [T, K] and probabilities
[T, K]. ``ids == -1`` marks an unused slot (a padding token, or a slot dropped by a capacity
factor); such a slot contributes nothing and receives a zero probability gradient. The compact
form is checked with the rest of a call's inputs (inputs.py).
"""

from __future__ import annotations

import torch

from .inputs import UNUSED_SLOT


def topk_from_routing_map(routing_map: torch.Tensor, probs: torch.Tensor, topk: int, *,
                          on_device: bool = False, rank: int = 0):
    """Convert Megatron's dense routing to ids/probs [T, topk], deterministically.

    The selected experts of a token are listed in ascending expert order; a token with fewer
    than ``topk`` selected experts gets ``UNUSED_SLOT`` in its trailing slots. Gradients flow
    from the compact probs back into the dense ``probs``.

    A token with more than ``topk`` selected experts (a map padded to expert capacity) is an
    error, never truncated: ``on_device`` (the CUDA backend, whose calls must not synchronize)
    checks it in a kernel that stops with a report naming the token and EP ``rank``
    (ops.check_routing_map); otherwise it is checked on the host and raises ``ValueError``.
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
    if on_device:
        from .cuda import ops

        ops.check_routing_map(routing_map, topk, rank)
    else:
        check_selected_per_token(routing_map, topk)
    # Sort keys: selected experts first, each group in ascending expert order. The key is
    # unique per (row, expert), so the (unstable) sort result is still unique.
    expert_index = torch.arange(num_experts, device=routing_map.device)
    key = torch.where(routing_map, expert_index, expert_index + num_experts)
    order = torch.sort(key, dim=1).indices[:, :topk]
    selected = torch.gather(routing_map, 1, order)
    ids = torch.where(selected, order, torch.full_like(order, UNUSED_SLOT)).to(torch.int32)
    topk_probs = torch.gather(probs, 1, order) * selected.to(probs.dtype)
    return ids, topk_probs


def check_selected_per_token(routing_map: torch.Tensor, topk: int) -> None:
    """Raise ValueError naming the first token whose routing map selects more than ``topk``
    experts (reads the map on the host)."""
    selected = routing_map.sum(dim=1)
    over = torch.nonzero(selected > topk)
    if over.numel():
        token = int(over[0, 0])
        raise ValueError(
            f"routing map: token {token} selects {int(selected[token])} experts, more than "
            f"moe_router_topk = {topk}; mok takes each token's top-k experts and cannot run a "
            f"padded routing map (Megatron's expert padding to capacity)")
