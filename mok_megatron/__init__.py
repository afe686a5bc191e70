"""mok_megatron: a fused MoE dispatch + experts + combine backend for Megatron-Core.

    from mok_megatron import moe_experts, load_recipe
    y = moe_experts(x, ids, probs, w1, w2, group=ep_group, recipe=load_recipe("bf16"))

Layers, each importing only those below it: megatron/ (the adapter; importing mok_megatron
alone does not touch Megatron) -> functional.py (the call: validated once in inputs.py, then
planned and run) -> cuda/ (the GPU backend) or reference/ (plain PyTorch), with recipes/ (the
FP8 number formats) and config.py beside them.
"""

__version__ = "0.1.0"
__all__ = ["Recipe", "load_recipe", "moe_experts"]

# Loaded on first use: the Megatron autoload hook imports this package at interpreter start.
_PUBLIC = {"Recipe": "config", "load_recipe": "config", "moe_experts": "functional"}


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'mok_megatron' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
