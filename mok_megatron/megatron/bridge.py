"""Select ``mok`` from Python: for Megatron-Bridge, whose model providers are
``TransformerConfig`` subclasses built in Python, and for any code that builds its own
``TransformerConfig`` without Megatron-LM's command line.

    from mok_megatron.megatron.bridge import use_mok

    cfg = deepseek_v3_pretrain_config(...)        # a Bridge ConfigContainer
    cfg.model.moe_shared_expert_overlap = False   # Bridge defaults mok refuses: docs/megatron.md
    use_mok(cfg.model, recipe="bf16")
    pretrain(cfg, forward_step)

``use_mok`` registers ``mok`` with Megatron (``register()``), selects the recipe for this
process when one is given (``recipe.set_recipe``: ahead of ``--mok-recipe`` and ``MOK_RECIPE``)
and sets one field, ``moe_token_dispatcher_type = "mok"``. It turns no other setting on or
off: a setting mok does not support is refused with ``MokConfigError``, naming it and what to
set instead, so that the model trained is the one the config describes.

When the support matrix is checked:
  - a Bridge config (one with ``finalize()``) defers Megatron's ``__post_init__`` to
    ``finalize()``, which Bridge runs in ``ConfigContainer.validate()`` after applying its
    mixed-precision and communication-overlap settings to the model config: the check runs
    there, on the settings the run will use, before any model is built;
  - a plain megatron-core ``TransformerConfig`` has run ``__post_init__`` already: ``use_mok``
    checks it now, and changes nothing when it refuses.
"""

from __future__ import annotations

from typing import Optional

from ..config import load_recipe
from . import register
from .recipe import active_recipe, set_recipe
from .validation import MOK, MokConfigError, check_config


def use_mok(config, recipe: Optional[str] = None) -> None:
    """Make ``config`` (a ``TransformerConfig``, e.g. a Bridge ``cfg.model``) run its MoE layers
    with ``mok``; ``recipe`` (a name under configs/recipes or a YAML path) becomes this
    process's recipe, and without it ``--mok-recipe`` / ``MOK_RECIPE`` / bf16 still apply."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not isinstance(config, TransformerConfig):
        raise TypeError(
            f"use_mok takes a TransformerConfig (a Bridge model provider is one: pass cfg.model), "
            f"got {type(config).__name__}"
        )
    if not config.num_moe_experts:
        raise MokConfigError(
            "use_mok: num_moe_experts is not set, so this config has no MoE layer for mok to run; "
            "set num_moe_experts first"
        )
    register()
    if not callable(getattr(config, "finalize", None)):
        check_config(config, active_recipe() if recipe is None else load_recipe(recipe))
    if recipe is not None:
        set_recipe(recipe)
    config.moe_token_dispatcher_type = MOK
