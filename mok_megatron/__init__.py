"""mok_megatron: a fused MoE dispatch + experts + combine backend for Megatron-Core."""

__version__ = "0.1.0"
