"""``MokTokenDispatcher``: Megatron's token-dispatcher hooks around one fused call.

Megatron's MoE forward is route -> dispatch_preprocess -> token_dispatch -> (dispatch_postprocess,
experts, combine_preprocess) -> token_combine -> combine_postprocess. With ``mok`` the router,
its aux / z losses, the shared expert and every module's parameters stay Megatron's; the
dispatcher keeps the routing in ``dispatch_preprocess``, passes tokens through ``token_dispatch``
and ``token_combine`` unchanged, and ``experts_compute`` (called in place of the experts module,
see ``patches.py``) runs dispatch -> experts -> combine as one ``functional.moe_experts`` call on
the experts module's own Parameters, so gradients land in Megatron's parameters unchanged. The
experts module's hooks are honoured (or refused) in ``expert_hooks.py`` before the call.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from megatron.core.transformer.moe.token_dispatcher import MoETokenDispatcher

from ..config import Recipe
from ..functional import moe_experts, resolve_backend
from ..routing import topk_from_routing_map
from .expert_hooks import ExpertHooks
from .recipe import layer_recipe
from .validation import MokConfigError, activation_name

# How the routed experts' modules are named in errors (their path under the MoE layer).
_EXPERTS = "mlp.experts"


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
        # The experts' hooks (expert_hooks.py), taken and their linears checked at the first
        # forward, once PEFT, which wraps modules after the model is built, has run.
        self.expert_hooks = None

    def dispatch_preprocess(self, hidden_states, routing_map, probs):
        self.hidden_shape = hidden_states.shape
        self.routing_map = routing_map
        return hidden_states.view(-1, self.hidden_shape[-1]), probs

    def token_dispatch(self, hidden_states, probs):
        # Tokens move inside the fused call.
        return hidden_states, probs

    def experts_compute(self, experts, hidden_states, probs,
                        layer_number: Optional[int] = None) -> torch.Tensor:
        """dispatch -> experts -> combine for this rank's tokens: [T, H] -> [T, H].
        `layer_number`: the MoE layer's (global, 1-based), which picks its recipe
        (recipe.layer_recipe: Megatron's first and last BF16 layers)."""
        recipe = layer_recipe(self.recipe, self.config, layer_number)
        # The CUDA backend's calls never synchronize: a routing map with more than top-k
        # experts for a token stops in a kernel there, and raises on the host elsewhere.
        on_device = resolve_backend(recipe, hidden_states.device) == "cuda"
        ids, topk_probs = topk_from_routing_map(self.routing_map, probs, self.topk,
                                                on_device=on_device,
                                                rank=getattr(self, "ep_rank", 0))
        self.routing_map = None
        if self.expert_hooks is None:
            check_expert_linears(experts)
            self.expert_hooks = ExpertHooks(experts, _EXPERTS)
        w1, w2 = expert_weights(experts)
        self.expert_hooks.before_fused_call([*w1, *w2])
        return moe_experts(
            hidden_states,
            ids,
            topk_probs,
            w1,
            w2,
            group=self.ep_group if self.ep_size > 1 else None,
            activation=self.activation,
            recipe=recipe,
            accumulate_main_grad=self.config.gradient_accumulation_fusion,
        )

    def token_combine(self, hidden_states):
        return hidden_states

    def combine_postprocess(self, hidden_states):
        return hidden_states.view(self.hidden_shape)


def expert_linears(experts) -> list[tuple[str, torch.nn.Module, list[str]]]:
    """(name, module, names of its weight Parameters) of the experts' FC1 and FC2 linears, FC1s
    first, in expert order."""
    from megatron.core.transformer.moe.experts import SequentialMLP, TEGroupedMLP

    if isinstance(experts, SequentialMLP):
        return [
            (f"local_experts.{i}.{fc}", getattr(expert, fc), ["weight"])
            for fc in ("linear_fc1", "linear_fc2")
            for i, expert in enumerate(experts.local_experts)
        ]
    if isinstance(experts, TEGroupedMLP):
        names = [f"weight{i}" for i in range(experts.num_local_experts)]
        return [(fc, getattr(experts, fc), names) for fc in ("linear_fc1", "linear_fc2")]
    raise TypeError(
        f"mok runs Megatron's SequentialMLP or TEGroupedMLP experts, got {type(experts).__name__} "
        f"(from the layer spec); use --moe-token-dispatcher-type alltoall for other experts"
    )


def expert_weights(experts) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
    """The experts module's own FC1 / FC2 Parameters, one per local expert, in expert order."""
    weights = [getattr(module, name) for _, module, names in expert_linears(experts)
               for name in names]
    half = len(weights) // 2
    return weights[:half], weights[half:]


def check_expert_linears(experts) -> None:
    """Refuse expert linears whose weights are not their own Parameters: a PEFT wrapper (e.g.
    Megatron-Bridge's LoRALinear, which keeps the base linear as ``to_wrap``) would have its
    adapter skipped by the fused call. Checked by structure, not by class, so that any linear
    class holding its weights directly (Megatron's, Transformer Engine's) passes."""
    for name, module, weight_names in expert_linears(experts):
        wrapped = getattr(module, "to_wrap", None)
        if wrapped is None and all(
            isinstance(module._parameters.get(w), torch.nn.Parameter) for w in weight_names
        ):
            continue
        what = (f"a {type(module).__name__} wrapping {type(wrapped).__name__} (a PEFT adapter "
                f"such as LoRA)" if wrapped is not None else
                f"a {type(module).__name__} without its own {weight_names[0]} Parameter")
        raise MokConfigError(
            f"{_EXPERTS}.{name} is {what}: mok's fused call reads the routed experts' weight "
            f"Parameters directly, so this module's own forward would never run. Apply PEFT to "
            f"non-expert modules only (leave linear_fc1 / linear_fc2 of {_EXPERTS} out of "
            f"Megatron-Bridge's LoRA target_modules, e.g. target_modules=['linear_qkv', "
            f"'linear_proj'], or set target_modules=[] with exclude_modules=['*.{_EXPERTS}.*']), "
            f"or use --moe-token-dispatcher-type alltoall"
        )
