"""``MokTokenDispatcher``: Megatron's token-dispatcher hooks around one fused call.

Megatron's MoE forward is route -> dispatch_preprocess -> token_dispatch -> (dispatch_postprocess,
experts, combine_preprocess) -> token_combine -> combine_postprocess. With ``mok`` the router,
its aux / z losses, the shared expert and every module's parameters stay Megatron's; the
dispatcher keeps the routing in ``dispatch_preprocess``, passes tokens through ``token_dispatch``
and ``token_combine`` unchanged, and ``experts_compute`` (called in place of the experts module,
see ``patches.py``) runs dispatch -> experts -> combine as one ``functional.moe_experts`` call on
the experts module's own Parameters, so gradients land in Megatron's parameters unchanged.
"""

from __future__ import annotations

from typing import Sequence

import torch
from megatron.core.transformer.moe.token_dispatcher import MoETokenDispatcher

from ..config import Recipe
from ..functional import moe_experts
from ..routing import topk_from_routing_map
from .validation import activation_name


class MokTokenDispatcher(MoETokenDispatcher):
    # dispatch_postprocess and combine_preprocess are left to the base class (which raises):
    # the fused call replaces the experts step they surround.

    def __init__(self, num_local_experts: int, config, pg_collection, recipe: Recipe) -> None:
        super().__init__(config=config, pg_collection=pg_collection)
        self.num_local_experts = num_local_experts
        self.topk = config.moe_router_topk
        self.activation = activation_name(config)
        self.recipe = recipe
        self.hidden_shape = None
        self.routing_map = None
        # Megatron's partial CUDA graphs ('moe_router' / 'moe_preprocess' scopes) replay
        # dispatch_preprocess inside the router graph without running its Python: the tensors
        # named here come back as graph outputs and are set on the dispatcher again before
        # experts_compute. hidden_shape is no tensor, and graphed shapes never change.
        self.cudagraph_attrs = ["routing_map"]

    def dispatch_preprocess(self, hidden_states, routing_map, probs):
        self.hidden_shape = hidden_states.shape
        self.routing_map = routing_map
        return hidden_states.view(-1, self.hidden_shape[-1]), probs

    def token_dispatch(self, hidden_states, probs):
        # Tokens move inside the fused call.
        return hidden_states, probs

    def experts_compute(self, experts, hidden_states, probs) -> torch.Tensor:
        """dispatch -> experts -> combine for this rank's tokens: [T, H] -> [T, H]."""
        ids, topk_probs = topk_from_routing_map(self.routing_map, probs, self.topk)
        self.routing_map = None
        w1, w2 = expert_weights(experts)
        return moe_experts(
            hidden_states,
            ids,
            topk_probs,
            w1,
            w2,
            group=self.ep_group if self.ep_size > 1 else None,
            activation=self.activation,
            recipe=self.recipe,
        )

    def token_combine(self, hidden_states):
        return hidden_states

    def combine_postprocess(self, hidden_states):
        return hidden_states.view(self.hidden_shape)


def expert_weights(experts) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
    """The experts module's own FC1 / FC2 Parameters, one per local expert, in expert order."""
    from megatron.core.transformer.moe.experts import SequentialMLP, TEGroupedMLP

    if isinstance(experts, SequentialMLP):
        local = experts.local_experts
        return [e.linear_fc1.weight for e in local], [e.linear_fc2.weight for e in local]
    if isinstance(experts, TEGroupedMLP):
        n = experts.num_local_experts
        fc1, fc2 = experts.linear_fc1, experts.linear_fc2
        return ([getattr(fc1, f"weight{i}") for i in range(n)],
                [getattr(fc2, f"weight{i}") for i in range(n)])
    raise TypeError(
        f"mok runs Megatron's SequentialMLP or TEGroupedMLP experts, got {type(experts).__name__} "
        f"(from the layer spec); use --moe-token-dispatcher-type alltoall for other experts"
    )
