"""The MoE layer in plain PyTorch (moe.py): the oracle every kernel is checked against, and the
backend that runs anywhere (CPU, any torch.distributed backend), under every recipe."""

from .moe import expert_mlp, moe_reference, reference_forward

__all__ = ["expert_mlp", "moe_reference", "reference_forward"]
