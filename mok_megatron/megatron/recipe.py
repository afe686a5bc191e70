"""Which recipe (precision, backend, kernel knobs) the ``mok`` MoE layers use.

The first of these that is set wins:
  1. ``set_recipe(NAME_OR_PATH)``, from Python (``bridge.use_mok`` calls it): the program's own
     choice, which a Megatron-Bridge run has no other way to make;
  2. Megatron's ``--mok-recipe NAME_OR_PATH`` (added to Megatron's parser by ``register()``);
  3. the environment variable ``MOK_RECIPE``;
  4. ``Recipe()``: bf16, backend ``auto``.
A name resolves under the repository's ``configs/recipes/``; a path is read as is. The choice
holds for the whole process: every MoE layer and every config check reads it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Optional

from ..config import FP8_PRECISIONS, Recipe, load_recipe

RECIPE_FLAG = "--mok-recipe"
RECIPE_ENV = "MOK_RECIPE"

_selected: Optional[str] = None


def set_recipe(source: Optional[str]) -> None:
    """Select the recipe for this process, ahead of ``--mok-recipe`` and ``MOK_RECIPE``: a name
    or a YAML path, loaded (and so checked) now. ``None`` clears the selection. Select it
    before configs are built: each config is checked against the recipe active then."""
    global _selected
    # The loaded recipe's name, which is the absolute path for a file outside configs/: a
    # relative path keeps meaning the same file if the working directory changes.
    _selected = None if source is None else _load(source).name


def recipe_source() -> Optional[str]:
    """The recipe name or path this run asks for, or None for the default recipe."""
    # Megatron's global args exist once a Megatron training script has parsed its arguments;
    # a program that builds MoE layers from megatron.core alone never imports this module.
    global_vars = sys.modules.get("megatron.training.global_vars")
    args = getattr(global_vars, "_GLOBAL_ARGS", None)
    return (_selected or getattr(args, "mok_recipe", None) or os.environ.get(RECIPE_ENV)
            or None)


def active_recipe() -> Recipe:
    source = recipe_source()
    return Recipe() if source is None else _load(source)


@functools.lru_cache(maxsize=None)
def _load(source: str) -> Recipe:
    return load_recipe(source)


def is_bf16_layer(config, layer_number: Optional[int]) -> bool:
    """Whether Megatron keeps the MoE layer of transformer layer ``layer_number`` (1-based and
    global, as ``MoELayer.layer_number``) in BF16 (``--first-last-layers-bf16``): its own
    fp8_utils.is_first_last_bf16_layer on layer_number - 1, as its transformer block asks.
    None (a multi-token-prediction layer, or a MoE layer outside a transformer block) runs
    outside that rule, in the model's FP8, as in Megatron."""
    from megatron.core.fp8_utils import is_first_last_bf16_layer

    return layer_number is not None and is_first_last_bf16_layer(config, layer_number - 1)


def layer_recipe(recipe: Recipe, config, layer_number: Optional[int]) -> Recipe:
    """The recipe one MoE layer runs: an FP8 recipe's routed experts run BF16 (same kernel
    knobs) in the layers Megatron keeps in BF16 (is_bf16_layer), as alltoall's experts do
    there; any other layer runs ``recipe`` as it is."""
    if recipe.precision not in FP8_PRECISIONS or not is_bf16_layer(config, layer_number):
        return recipe
    # mxfp8_weights is read by mxfp8 alone (config.recipe_problems).
    return dataclasses.replace(recipe, precision="bf16",
                               kernel=dataclasses.replace(recipe.kernel, mxfp8_weights="auto"))
