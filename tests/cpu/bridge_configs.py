"""MoE configs built the three ways ``use_mok`` meets them, with the shapes of megatron_harness:

  - ``core``: megatron-core's ``TransformerConfig``, whose ``__post_init__`` runs as it is built;
  - ``deferred``: a ``TransformerConfig`` subclass built the way Megatron-Bridge builds its
    model providers: construction skips ``__post_init__``, ``finalize()`` runs it (Bridge's
    ``models/transformer_config.py`` does this; the stand-in tests that path without Bridge);
  - ``bridge``: Megatron-Bridge's own ``GPTModelProvider``, where megatron-bridge is importable.

Each starts as an ``alltoall`` config, as a Bridge recipe would hand it over.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from typing import Optional

import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_harness import config_values

KINDS = ("core", "deferred", "bridge")
BRIDGE_INSTALL = "pip install --no-deps megatron-bridge==0.6.2 omegaconf"


@dataclasses.dataclass
class DeferredConfig(TransformerConfig):
    def __post_init__(self) -> None:
        pass

    def finalize(self) -> None:
        TransformerConfig.__post_init__(self)


def bridge_missing() -> Optional[str]:
    """Why Bridge's provider cannot be imported here, or None."""
    if importlib.util.find_spec("megatron.bridge") is None:
        return f"megatron-bridge is not installed ({BRIDGE_INSTALL})"
    # megatron-bridge 0.6.2 imports megatron.training.models, which megatron-core has from 0.18.
    if importlib.util.find_spec("megatron.training.models") is None:
        return "megatron-bridge 0.6.2 needs megatron-core >= 0.18 (megatron.training.models)"
    return None


def bridge_gpt_provider() -> Optional[type]:
    """Megatron-Bridge's ``GPTModelProvider``, or None where megatron-bridge is not installed.
    Bridge's package ``__init__`` files import every model bridge, and through them HF
    transformers and Transformer Engine (which has no CPU build); the provider's own module
    needs neither, so those two packages are made as modules without running their
    ``__init__``."""
    if bridge_missing() is not None:
        return None
    for name in ("megatron.bridge", "megatron.bridge.models"):
        if name not in sys.modules:
            sys.modules[name] = importlib.util.module_from_spec(importlib.util.find_spec(name))
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    return GPTModelProvider


def moe_config(kind: str, **overrides):
    values = config_values("alltoall", overrides.pop("expert_model_parallel_size", 1),
                           gated_linear_unit=True, activation_func=F.silu, **overrides)
    if kind == "core":
        return TransformerConfig(**values)
    if kind == "deferred":
        return DeferredConfig(**values)
    provider = bridge_gpt_provider()
    if provider is None:
        raise RuntimeError(bridge_missing())
    return provider(vocab_size=128, **values)


def finalize(config) -> None:
    """What Bridge's ConfigContainer.validate() does to the model config; nothing for ``core``."""
    if callable(getattr(config, "finalize", None)):
        config.finalize()
