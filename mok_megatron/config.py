"""Configuration: precision recipes and kernel knobs (configs/recipes/*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class KernelKnobs:
    # Workspace sizing: the most tokens one rank passes to one MoE layer call. The
    # symmetric workspace holds the worst case (every token of every rank routed to one
    # rank), so no routing skew can overflow it.
    max_tokens_per_rank: int = 16384
    comm_sms_forward: int = 16
    comm_sms_backward: int = 16
    minibatch_tokens: int = 2048
    macrobatch_tokens: int = 16384
    schedule_capacity: float = 1.0
    # Every wait on a peer flag fails with an error naming rank and stage after this long.
    spin_timeout_ms: int = 10000
    # Validate expert ids / probs values on the host before each call (synchronizes).
    check_inputs: bool = False


@dataclass(frozen=True)
class Recipe:
    name: str = "bf16"
    precision: Literal["bf16", "mxfp8"] = "bf16"
    backend: Literal["auto", "cuda", "reference"] = "auto"
    kernel: KernelKnobs = field(default_factory=KernelKnobs)
