"""Megatron's argument parser accepts ``mok`` once registered; a ``mok`` TransformerConfig with an
unsupported setting is refused when it is built, by an error naming the setting and what to do
instead; the recipe comes from --mok-recipe, else MOK_RECIPE."""

from __future__ import annotations

import argparse
import sys
import typing

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("megatron.training")

from megatron.core.transformer.moe.moe_layer import MoELayer  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from mok_megatron.config import ConfigError  # noqa: E402
from mok_megatron.megatron import register  # noqa: E402
from mok_megatron.megatron.recipe import active_recipe  # noqa: E402
from mok_megatron.megatron.validation import MokConfigError, uses_mok  # noqa: E402

VALID = dict(
    num_layers=1,
    hidden_size=16,
    num_attention_heads=2,
    num_moe_experts=4,
    moe_ffn_hidden_size=8,
    moe_token_dispatcher_type="mok",
    gated_linear_unit=True,
    activation_func=F.silu,
    add_bias_linear=False,
)


@pytest.fixture(scope="module", autouse=True)
def registered():
    register()


@pytest.fixture(autouse=True)
def no_recipe_env(monkeypatch):
    monkeypatch.delenv("MOK_RECIPE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def parse(monkeypatch, *argv):
    from megatron.training.arguments import parse_args

    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
    return parse_args()


def recipe_file(tmp_path, **fields) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    return str(path)


def test_parser_accepts_mok_and_the_recipe_flag(monkeypatch):
    args = parse(monkeypatch, "--moe-token-dispatcher-type", "mok", "--mok-recipe", "bf16")
    assert args.moe_token_dispatcher_type == "mok"
    assert args.mok_recipe == "bf16"


def test_parser_keeps_megatron_choices(monkeypatch):
    assert parse(monkeypatch, "--moe-token-dispatcher-type", "alltoall").mok_recipe is None
    with pytest.raises(SystemExit):
        parse(monkeypatch, "--moe-token-dispatcher-type", "mokk")


def test_register_is_idempotent():
    init, compute = MoELayer.__init__, MoELayer.routed_experts_compute
    register()
    assert (MoELayer.__init__, MoELayer.routed_experts_compute) == (init, compute)
    field = TransformerConfig.__dataclass_fields__["moe_token_dispatcher_type"]
    assert typing.get_args(field.type) == ("allgather", "alltoall", "flex", "mok")


def test_valid_config_builds():
    config = TransformerConfig(**VALID, moe_shared_expert_intermediate_size=8,
                               moe_router_dtype="fp32", moe_z_loss_coeff=1e-3)
    assert uses_mok(config)


def test_newer_megakernel_spelling_selects_mok():
    config = argparse.Namespace(moe_token_dispatcher_type="alltoall", moe_megakernel_backend="mok")
    assert uses_mok(config)
    assert not uses_mok(argparse.Namespace(moe_token_dispatcher_type="alltoall"))


# (overrides of VALID, words the error must contain: the setting, then the way out)
REFUSED = {
    "expert_tensor_parallel": (
        dict(tensor_model_parallel_size=2, sequence_parallel=True),
        ["expert_tensor_parallel_size=2", "--expert-tensor-parallel-size 1", "alltoall"]),
    "shared_expert_overlap": (
        dict(moe_shared_expert_intermediate_size=8, moe_shared_expert_overlap=True),
        ["moe_shared_expert_overlap", "is not needed", "remove --moe-shared-expert-overlap"]),
    "ep_comm_overlap": (
        dict(overlap_moe_expert_parallel_comm=True, expert_model_parallel_size=2, bf16=True),
        ["overlap_moe_expert_parallel_comm", "is not needed",
         "remove --overlap-moe-expert-parallel-comm"]),
    "expert_bias": (dict(add_bias_linear=True), ["add_bias_linear", "--disable-bias-linear"]),
    "probs_on_input": (
        dict(moe_apply_probs_on_input=True, moe_router_topk=1, moe_router_pre_softmax=True),
        ["--moe-apply-probs-on-input", "alltoall"]),
    "quick_geglu": (dict(activation_func="quick_gelu"), ["--quick-geglu", "alltoall"]),
    "activation_clamp": (
        dict(activation_func_clamp_value=7.0),
        ["--activation-func-clamp-value", "alltoall"]),
    "unknown_activation": (
        dict(activation_func=torch.tanh, gated_linear_unit=False),
        ["activation_func=tanh", "alltoall"]),
    "tanh_gelu": (
        dict(activation_func=F.gelu, bias_activation_fusion=True),
        ["geglu", "--no-bias-gelu-fusion"]),
    "latent": (dict(moe_latent_size=8), ["--moe-latent-size", "alltoall"]),
    "fp8_with_bf16_recipe": (
        dict(fp8="e4m3", bf16=True), ["--fp8-format", "--mok-recipe mxfp8"]),
    "pad_to_capacity": (
        dict(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True),
        ["--moe-pad-expert-input-to-capacity", "remove the flag"]),
    "activation_recompute": (
        dict(recompute_granularity="selective", recompute_modules=["moe_act"]),
        ["'moe_act'", "'moe'"]),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_setting_is_refused(case):
    overrides, words = REFUSED[case]
    if overrides.get("activation_func") == "quick_gelu":
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        overrides = {**overrides, "activation_func": quick_gelu}
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**{**VALID, **overrides})
    for word in words:
        assert word in str(error.value), f"{word!r} not in: {error.value}"


def test_all_problems_are_reported_together():
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**{**VALID, "add_bias_linear": True,
                             "cuda_graph_impl": "transformer_engine"})
    assert "--disable-bias-linear" in str(error.value)
    assert "--cuda-graph-impl local" in str(error.value)


def test_ep_group_larger_than_a_node_is_refused(monkeypatch, tmp_path):
    # The check applies where the CUDA kernels may run; force that with a cuda-backend recipe.
    monkeypatch.setenv("MOK_RECIPE", recipe_file(tmp_path, backend="cuda"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**VALID, expert_model_parallel_size=4)
    assert "expert_model_parallel_size=4" in str(error.value)
    assert "alltoall or flex" in str(error.value)


def test_unsupported_settings_are_megatrons_own_business_without_mok():
    TransformerConfig(**{**VALID, "moe_token_dispatcher_type": "alltoall", "add_bias_linear": True})


def test_hybridep_needs_deep_ep():
    try:
        import deep_ep

        if hasattr(deep_ep, "HybridEPBuffer"):
            pytest.skip("deep_ep.HybridEPBuffer is installed")
    except ImportError:
        pass
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**{**VALID, "moe_token_dispatcher_type": "flex",
                             "moe_flex_dispatcher_backend": "hybridep", "moe_router_dtype": "fp32"})
    assert "deep_ep.HybridEPBuffer" in str(error.value)
    assert "hybrid-ep" in str(error.value)


def test_recipe_from_environment_then_flag(monkeypatch, tmp_path):
    from megatron.training import global_vars

    assert active_recipe().backend == "auto"  # the default recipe
    monkeypatch.setenv("MOK_RECIPE", recipe_file(tmp_path, backend="reference"))
    assert active_recipe().backend == "reference"
    flag_path = tmp_path / "flag"
    flag_path.mkdir()
    flagged = recipe_file(flag_path, backend="cuda")
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", argparse.Namespace(mok_recipe=flagged))
    assert active_recipe().backend == "cuda"  # --mok-recipe wins over MOK_RECIPE


def test_unknown_recipe_fails_when_the_config_is_built(monkeypatch):
    monkeypatch.setenv("MOK_RECIPE", "no_such_recipe")
    with pytest.raises(ConfigError, match="no_such_recipe"):
        TransformerConfig(**VALID)
