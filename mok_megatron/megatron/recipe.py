"""Which recipe (precision, backend, kernel knobs) the ``mok`` MoE layers use.

In order: Megatron's ``--mok-recipe NAME_OR_PATH`` (added to Megatron's parser by
``register()``), else the environment variable ``MOK_RECIPE``, else ``Recipe()`` (bf16, backend
``auto``). A name resolves under the repository's ``configs/recipes/``; a path is read as is.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Optional

from ..config import Recipe, load_recipe

RECIPE_FLAG = "--mok-recipe"
RECIPE_ENV = "MOK_RECIPE"


def recipe_source() -> Optional[str]:
    """The recipe name or path this run asks for, or None for the default recipe."""
    # Megatron's global args exist once a Megatron training script has parsed its arguments;
    # a program that builds MoE layers from megatron.core alone never imports this module.
    global_vars = sys.modules.get("megatron.training.global_vars")
    args = getattr(global_vars, "_GLOBAL_ARGS", None)
    return getattr(args, "mok_recipe", None) or os.environ.get(RECIPE_ENV) or None


def active_recipe() -> Recipe:
    source = recipe_source()
    return Recipe() if source is None else _load(source)


@functools.lru_cache(maxsize=None)
def _load(source: str) -> Recipe:
    return load_recipe(source)
