"""Which precision each mok MoE layer runs: under an FP8 mok recipe, the layers Megatron keeps
in BF16 (--first-last-layers-bf16 with --num-layers-at-start-in-bf16 / -at-end-in-bf16) run
their routed experts in BF16, as alltoall's experts do there; the others run the recipe."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import megatron_workers
from megatron_harness import MOK_CONFIG, run_distributed
from mok_megatron.config import Recipe
from mok_megatron.megatron.recipe import is_bf16_layer, layer_recipe

pytest.importorskip("megatron.core")


@pytest.fixture(scope="module")
def outs():
    (result,) = run_distributed(1, megatron_workers.first_last_bf16_layers)
    return result


def test_first_and_last_layers_run_bf16_experts(outs):
    """Layers 1 and 4 give the bf16 recipe's output bit for bit; layers 2 and 3 the FP8
    recipe's, which differs from it."""
    for number in (1, 4):
        assert torch.equal(outs[("fp8_blockwise", number)], outs[("bf16", number)]), number
    for number in (2, 3):
        assert not torch.equal(outs[("fp8_blockwise", number)], outs[("bf16", number)]), number


def test_layers_outside_the_block_keep_the_recipe():
    """A MoE layer without a block's layer number (multi-token prediction, a standalone layer)
    runs the FP8 recipe, as Megatron runs it under its model-wide FP8 context."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(**{**MOK_CONFIG, "num_layers": 3, "first_last_layers_bf16": True})
    recipe = Recipe(name="bw", precision="fp8_blockwise")
    assert not is_bf16_layer(config, None)
    assert layer_recipe(recipe, config, None) is recipe
    assert is_bf16_layer(config, 1) and not is_bf16_layer(config, 2) and is_bf16_layer(config, 3)


def test_layer_recipe_keeps_the_knobs():
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(**{**MOK_CONFIG, "num_layers": 3, "first_last_layers_bf16": True})
    recipe = Recipe(name="mx", precision="mxfp8")
    recipe = dataclasses.replace(recipe, kernel=dataclasses.replace(
        recipe.kernel, mxfp8_weights="codes", comm_sms_forward=9))
    first = layer_recipe(recipe, config, 1)
    assert first.precision == "bf16" and first.kernel.comm_sms_forward == 9
    assert first.kernel.mxfp8_weights == "auto"  # read by mxfp8 alone
    assert layer_recipe(recipe, config, 2) is recipe
    assert layer_recipe(Recipe(), config, 1) == Recipe()
