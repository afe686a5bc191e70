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


@pytest.mark.parametrize("start,end", [(1, 1), (2, 0), (0, 3), (0, 0)])
def test_bf16_layers_are_megatrons(start, end):
    """The rule is Megatron's own (fp8_utils.is_first_last_bf16_layer on layer_number - 1)."""
    from megatron.core.fp8_utils import is_first_last_bf16_layer
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(**{**MOK_CONFIG, "num_layers": 6, "first_last_layers_bf16": True,
                                  "num_layers_at_start_in_bf16": start,
                                  "num_layers_at_end_in_bf16": end})
    for number in range(1, 7):
        assert is_bf16_layer(config, number) == is_first_last_bf16_layer(config, number - 1)
    config.first_last_layers_bf16 = False
    assert not any(is_bf16_layer(config, n) for n in range(1, 7))


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
