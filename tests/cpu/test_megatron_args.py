"""Megatron's argument parser accepts ``mok`` once registered; a ``mok`` TransformerConfig with an
unsupported setting is refused when it is built, by an error naming the setting and what to do
instead, also where the setting is spelled the deprecated way Megatron's __post_init__ converts;
the recipe comes from set_recipe(), else --mok-recipe, else MOK_RECIPE."""

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

from megatron_harness import MOK_CONFIG, recipe_file  # noqa: E402
from mok_megatron.config import ConfigError  # noqa: E402
from mok_megatron.megatron import register  # noqa: E402
from mok_megatron.megatron.recipe import active_recipe, set_recipe  # noqa: E402
from mok_megatron.megatron.validation import MokConfigError, uses_mok  # noqa: E402

VALID = MOK_CONFIG


@pytest.fixture(scope="module", autouse=True)
def registered():
    register()


@pytest.fixture(autouse=True)
def no_recipe_env(monkeypatch):
    monkeypatch.delenv("MOK_RECIPE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    yield
    set_recipe(None)


def parse(monkeypatch, *argv):
    from megatron.training.arguments import parse_args

    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
    return parse_args()


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
        dict(fp8="e4m3", bf16=True), ["--fp8-format", "drop --fp8-format", "--mok-recipe mxfp8"]),
    "fp16": (
        dict(fp16=True, params_dtype=torch.float16), ["fp16 (--fp16", "--bf16", "alltoall"]),
    "fp16_params_only": (dict(params_dtype=torch.float16), ["params_dtype=float16", "--bf16"]),
    "pad_to_capacity": (
        dict(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True),
        ["--moe-pad-expert-input-to-capacity", "remove the flag"]),
    "rank_capacity": (
        dict(moe_expert_rank_capacity_factor=1.5, moe_flex_dispatcher_backend="hybridep"),
        ["moe_expert_rank_capacity_factor", "remove --moe-expert-rank-capacity-factor"]),
    "paged_stash": (
        dict(moe_paged_stash=True, moe_expert_rank_capacity_factor=1.5,
             moe_flex_dispatcher_backend="hybridep", use_transformer_engine_op_fuser=True),
        ["moe_paged_stash", "remove --moe-paged-stash"]),
    # Deprecated spellings, which Megatron's __post_init__ turns into the settings above.
    "external_cuda_graph": (
        dict(external_cuda_graph=True),
        ["cuda_graph_impl='transformer_engine'", "deprecated spelling of cuda_graph_impl"]),
    # Megatron converts it, then refuses it without fp8 ("fp8/fp4 must be specified ..."):
    # the matrix's reason is raised instead.
    "router_padding_for_fp8": (
        dict(moe_router_padding_for_fp8=True),
        ["moe_router_padding_for_quantization", "is not needed", "remove the flag",
         "deprecated spelling of moe_router_padding_for_quantization"]),
    "activation_recompute": (
        dict(recompute_granularity="selective", recompute_modules=["moe_act"]),
        ["'moe_act'", "'moe'"]),
    # Megatron's decode-time expert padding: routing maps with more than top-k experts.
    "pad_for_cuda_graph_inference": (
        dict(moe_pad_experts_for_cuda_graph_inference=True),
        ["--moe-pad-experts-for-cuda-graph-inference", "more than top-k", "alltoall"]),
    "router_fp64": (
        dict(moe_router_dtype="fp64"), ["--moe-router-dtype fp64", "--moe-router-dtype fp32"]),
    "expert_weight_shards": (
        dict(expert_tensor_parallel_num_weight_shards=2),
        ["--expert-tensor-parallel-num-weight-shards", "leave it unset", "alltoall"]),
    "fp8_input_store": (
        dict(activation_func_fp8_input_store=True),
        ["--activation-func-fp8-input-store", "remove the flag", "alltoall"]),
    "te_silu_is_relu": (
        dict(gated_linear_unit=False, use_te_activation_func=True),
        ["non-gated silu with use_te_activation_func", "computes ReLU",
         "leave --use-te-activation-func off"]),
    "autocast": (dict(enable_autocast=True), ["enable_autocast", "--bf16", "alltoall"]),
    "quant_recipe": (
        dict(quant_recipe="recipe_config"),
        ["--te-precision-config-file", "--mok-recipe", "alltoall"]),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_setting_is_refused(case):
    overrides, words = REFUSED[case]
    missing = set(overrides) - set(TransformerConfig.__dataclass_fields__)
    if missing:
        # Settings newer than this megatron-core (moe_paged_stash and the rank capacity factor
        # arrived in 0.18): nothing to refuse.
        pytest.skip(f"this megatron-core has no {sorted(missing)}")
    if overrides.get("quant_recipe") == "recipe_config":
        from megatron.core.quantization.quant_config import RecipeConfig

        overrides = {**overrides, "quant_recipe": RecipeConfig([], {})}
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


def test_deprecated_spellings_are_reported_with_the_other_problems():
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**VALID, fp16=True, external_cuda_graph=True)
    assert "fp16 (--fp16" in str(error.value)
    assert "cuda_graph_impl='transformer_engine'" in str(error.value)


def test_megatrons_own_refusal_is_the_cause_of_ours():
    # Megatron refuses shared-expert overlap for any dispatcher but alltoall and flex, with a
    # message that does not say what to do with mok.
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**VALID, moe_shared_expert_intermediate_size=8,
                          moe_shared_expert_overlap=True)
    assert "remove --moe-shared-expert-overlap" in str(error.value)
    assert isinstance(error.value.__cause__, ValueError)
    # 0.19: "... only works with alltoall or flex token dispatcher"; 0.17: "... with alltoall".
    assert "moe_shared_expert_overlap only works with alltoall" in str(error.value.__cause__)


def test_megatrons_refusal_stands_where_mok_has_none():
    with pytest.raises(ValueError, match="num_attention_heads") as error:
        TransformerConfig(**{**VALID, "num_attention_heads": 3, "tensor_model_parallel_size": 2,
                             "expert_tensor_parallel_size": 1, "sequence_parallel": True})
    assert not isinstance(error.value, MokConfigError)


def test_mxfp8_recipe_is_accepted(monkeypatch):
    """Both backends run MXFP8 (mxfp8.py, operands.py): the recipe builds a config."""
    from megatron.training import global_vars

    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", argparse.Namespace(mok_recipe="mxfp8"))
    config = TransformerConfig(**VALID, bf16=True)
    assert config.moe_token_dispatcher_type == "mok"


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


def test_set_recipe_wins_over_flag_and_environment(monkeypatch, tmp_path):
    from megatron.training import global_vars

    monkeypatch.setenv("MOK_RECIPE", recipe_file(tmp_path, backend="reference"))
    flag_path = tmp_path / "flag"
    flag_path.mkdir()
    flagged = recipe_file(flag_path, backend="cuda")
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", argparse.Namespace(mok_recipe=flagged))
    chosen_path = tmp_path / "chosen"
    chosen_path.mkdir()
    chosen = recipe_file(chosen_path, backend="auto", precision="bf16")
    set_recipe(chosen)
    assert active_recipe().name == chosen
    set_recipe(None)
    assert active_recipe().backend == "cuda"  # back to --mok-recipe


def test_set_recipe_checks_the_recipe_now():
    set_recipe("bf16")
    with pytest.raises(ConfigError, match="no_such_recipe"):
        set_recipe("no_such_recipe")
    assert active_recipe().name == "bf16"  # the selection is unchanged


def test_unknown_recipe_fails_when_the_config_is_built(monkeypatch):
    monkeypatch.setenv("MOK_RECIPE", "no_such_recipe")
    with pytest.raises(ConfigError, match="no_such_recipe"):
        TransformerConfig(**VALID)


def test_fp8_blockwise_recipe_takes_tes_blockwise_recipe_or_none(monkeypatch):
    """Under --mok-recipe fp8_blockwise the rest of the model runs TE's blockwise FP8 or stays
    BF16; another --fp8-recipe would make mok's experts differ from alltoall's."""
    from megatron.core.transformer import transformer_config

    monkeypatch.setenv("MOK_RECIPE", "fp8_blockwise")
    assert TransformerConfig(**VALID, bf16=True).moe_token_dispatcher_type == "mok"
    # Megatron refuses MoE FP8 without Transformer Engine, which this machine may not have.
    monkeypatch.setattr(transformer_config, "is_te_min_version", lambda *args, **kwargs: True)
    config = TransformerConfig(**VALID, bf16=True, fp8="e4m3", fp8_recipe="blockwise")
    assert config.fp8_recipe == "blockwise"
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**VALID, bf16=True, fp8="e4m3", fp8_recipe="delayed")
    assert "fp8_recipe='delayed' (--fp8-recipe)" in str(error.value)
    assert "pass --fp8-recipe blockwise" in str(error.value)


def test_fp8_blockwise_recipe_on_the_cuda_backend_is_refused(monkeypatch, tmp_path):
    """Where mok's CUDA kernels would run it while config.CUDA_PRECISIONS does not list it
    (before its kernels land): refused when the config is built, naming the recipe and the
    way out."""
    from mok_megatron.megatron import validation

    monkeypatch.setattr(validation, "CUDA_PRECISIONS", ("bf16", "mxfp8"))
    monkeypatch.setenv("MOK_RECIPE", recipe_file(tmp_path, precision="fp8_blockwise",
                                                 backend="cuda"))
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**VALID, bf16=True)
    assert "precision fp8_blockwise has no CUDA kernels yet" in str(error.value)
    assert "backend: reference" in str(error.value)


# Megatron's FP8 flags with a mok FP8 recipe: (mok recipe, overrides, None where accepted,
# else words of the refusal). Under alltoall Transformer Engine runs the experts with
# --fp8-format / --fp8-recipe: mok's recipe must be that one.
FP8_SETTINGS = {
    "mxfp8_tensorwise": ("mxfp8", dict(fp8="e4m3", fp8_recipe="tensorwise"),
                         ["fp8_recipe='tensorwise' (--fp8-recipe)", "pass --fp8-recipe mxfp8"]),
    "mxfp8_delayed": ("mxfp8", dict(fp8="e4m3", fp8_recipe="delayed"),
                      ["fp8_recipe='delayed'", "pass --fp8-recipe mxfp8"]),
    "mxfp8_blockwise": ("mxfp8", dict(fp8="e4m3", fp8_recipe="blockwise"),
                        ["fp8_recipe='blockwise'", "pass --fp8-recipe mxfp8"]),
    "mxfp8_mxfp8": ("mxfp8", dict(fp8="e4m3", fp8_recipe="mxfp8"), None),
    "mxfp8_hybrid": ("mxfp8", dict(fp8="hybrid", fp8_recipe="mxfp8"),
                     ["fp8='hybrid' (--fp8-format hybrid)", "E5M2", "pass --fp8-format e4m3"]),
    "blockwise_hybrid": ("fp8_blockwise", dict(fp8="hybrid", fp8_recipe="blockwise"),
                         ["fp8='hybrid'", "pass --fp8-format e4m3"]),
    "fp8_param": ("fp8_blockwise", dict(fp8="e4m3", fp8_recipe="blockwise", fp8_param=True),
                  ["fp8_param (--fp8-param-gather)", "remove the flag", "alltoall"]),
    "local_linears": ("fp8_blockwise",
                      dict(fp8="e4m3", fp8_recipe="blockwise", transformer_impl="local"),
                      ["--transformer-impl local", "run bf16",
                       "use --transformer-impl transformer_engine"]),
}


@pytest.mark.parametrize("case", list(FP8_SETTINGS))
def test_fp8_settings_follow_the_mok_recipe_or_are_refused(monkeypatch, case):
    from megatron.core.transformer import transformer_config

    recipe, overrides, words = FP8_SETTINGS[case]
    monkeypatch.setenv("MOK_RECIPE", recipe)
    # Megatron refuses MoE FP8 without Transformer Engine, which this machine may not have.
    monkeypatch.setattr(transformer_config, "is_te_min_version", lambda *args, **kwargs: True)
    if words is None:
        assert TransformerConfig(**VALID, bf16=True, **overrides).fp8 == overrides["fp8"]
        return
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**VALID, bf16=True, **overrides)
    for word in words:
        assert word in str(error.value), f"{word!r} not in: {error.value}"


def test_fp32_parameters_are_refused_where_the_kernels_would_run(monkeypatch, tmp_path):
    """The CUDA kernels run bf16: an fp32 model is refused when its config is built (not at
    the first call), where they would run; the reference backend runs it."""
    monkeypatch.setenv("MOK_RECIPE", recipe_file(tmp_path, precision="bf16", backend="cuda"))
    with pytest.raises(MokConfigError) as error:
        TransformerConfig(**VALID)
    assert "params_dtype=float32 (no --bf16)" in str(error.value)
    assert "backend: reference" in str(error.value)
    reference = tmp_path / "reference"  # recipes are cached by path
    reference.mkdir()
    monkeypatch.setenv("MOK_RECIPE", recipe_file(reference, precision="bf16",
                                                 backend="reference"))
    assert TransformerConfig(**VALID).params_dtype == torch.float32


@pytest.mark.parametrize("megatron_version,refused", [((0, 17), False), ((0, 19), True)])
def test_decode_padding_flag_only_where_megatron_does_not_demand_it(monkeypatch,
                                                                     megatron_version, refused):
    """megatron-core 0.17's argument validation demands --moe-pad-experts-for-cuda-graph-
    inference for local CUDA graphs with EP > 1 (training never reads it; a padded routing map
    still stops in the conversion): accepted there, refused elsewhere."""
    from megatron.core import package_info

    monkeypatch.setattr(package_info, "VERSION", (*megatron_version, 0, ""))
    overrides = dict(moe_pad_experts_for_cuda_graph_inference=True, cuda_graph_impl="local",
                     expert_model_parallel_size=2, bf16=True)
    if not refused:
        assert TransformerConfig(**VALID, **overrides).moe_pad_experts_for_cuda_graph_inference
        return
    with pytest.raises(MokConfigError, match="--moe-pad-experts-for-cuda-graph-inference"):
        TransformerConfig(**VALID, **overrides)
