"""Megatron-Core adapter: ``--moe-token-dispatcher-type mok``.

Nothing here touches Megatron on import. Megatron learns ``mok`` in one of three ways:
  - ``register()``, called explicitly (the driver ``scripts/pretrain_mok_gpt.py`` does);
  - ``python -m mok_megatron.megatron.launch SCRIPT ARGS...``: registers, then runs SCRIPT
    (e.g. Megatron-LM's unchanged ``pretrain_gpt.py``) as ``__main__``;
  - the opt-in autoload: with ``MOK_MEGATRON=1`` in the environment and the autoload ``.pth``
    file installed (``python -m mok_megatron.megatron.autoload install``), every Python process
    registers as it imports Megatron.
See docs/megatron.md for the support matrix.
"""

from __future__ import annotations


def register() -> None:
    """Teach the importable Megatron the ``mok`` dispatcher; calling it again does nothing."""
    from . import patches

    patches.patch_transformer_config()
    patches.patch_moe_layer()
    patches.patch_arguments()
