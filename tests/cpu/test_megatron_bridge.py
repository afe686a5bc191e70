"""``use_mok``, the Python way to select ``mok`` and a recipe (Megatron-Bridge): on megatron-core
configs, on configs whose ``__post_init__`` is deferred to ``finalize()`` as Bridge's are, and on
Bridge's own ``GPTModelProvider`` where megatron-bridge is installed. It selects mok and the
recipe, and refuses, rather than changes, the settings mok does not support."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron_workers  # noqa: E402
from bridge_configs import KINDS, bridge_missing, finalize, moe_config  # noqa: E402
from megatron_harness import recipe_file, run_distributed  # noqa: E402
from mok_megatron.megatron.bridge import use_mok  # noqa: E402
from mok_megatron.megatron.recipe import active_recipe, set_recipe  # noqa: E402
from mok_megatron.megatron.validation import MokConfigError  # noqa: E402


@pytest.fixture(params=KINDS)
def kind(request):
    if request.param == "bridge" and bridge_missing() is not None:
        pytest.skip(bridge_missing())
    return request.param


@pytest.fixture(autouse=True)
def no_recipe_selected(monkeypatch):
    monkeypatch.delenv("MOK_RECIPE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    set_recipe(None)
    yield
    set_recipe(None)


def test_use_mok_selects_mok_and_the_recipe(kind, tmp_path):
    recipe = recipe_file(tmp_path, backend="reference")
    config = moe_config(kind)
    use_mok(config, recipe=recipe)
    finalize(config)
    assert config.moe_token_dispatcher_type == "mok"
    assert active_recipe().name == recipe and active_recipe().backend == "reference"


def test_use_mok_without_a_recipe_leaves_the_choice_to_the_environment(monkeypatch, tmp_path):
    recipe = recipe_file(tmp_path, backend="reference")
    monkeypatch.setenv("MOK_RECIPE", recipe)
    use_mok(moe_config("core"))
    assert active_recipe().name == recipe


# Settings a Bridge recipe or model provider may hand over, which mok refuses; each has a way
# out that the refusal names. (overrides of bridge_configs.moe_config, words of the refusal)
BRIDGE_DEFAULTS_REFUSED = {
    # DeepSeek-V2/V3/V4 and Kimi providers set it.
    "shared_expert_overlap": (
        dict(moe_shared_expert_intermediate_size=8, moe_shared_expert_overlap=True),
        ["moe_shared_expert_overlap", "is not needed"]),
    # Qwen3 / Qwen3.5 recipes capture Transformer Engine CUDA graphs.
    "te_cuda_graphs": (dict(cuda_graph_impl="transformer_engine"), ["cuda_graph_impl"]),
    # What CommOverlapConfig(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
    # sets on the model config (the Qwen3 MoE GB200 recipe).
    "ep_comm_overlap": (
        dict(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True,
             expert_model_parallel_size=2, bf16=True),
        ["overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "is not needed"]),
    # DeepSeek-V4, Qwen3-Next, Nemotron-3 and MiniMax recipes recompute the experts' activation.
    "moe_act_recompute": (
        dict(recompute_granularity="selective", recompute_modules=["moe_act"],
             moe_grouped_gemm=True),
        ["'moe_act'", "'moe'"]),
    # TransformerConfig's (and so GPTModelProvider's) default; GPT-OSS sets it on purpose.
    "linear_bias": (dict(add_bias_linear=True), ["add_bias_linear", "--disable-bias-linear"]),
    # What Bridge's fp16_mixed precision config sets.
    "fp16": (dict(fp16=True, params_dtype=torch.float16), ["fp16", "--bf16"]),
}


@pytest.mark.parametrize("case", list(BRIDGE_DEFAULTS_REFUSED))
def test_use_mok_refuses_what_mok_does_not_support(kind, case):
    overrides, words = BRIDGE_DEFAULTS_REFUSED[case]
    config = moe_config(kind, **overrides)
    with pytest.raises(MokConfigError) as error:
        use_mok(config, recipe="bf16")
        finalize(config)
    for word in words:
        assert word in str(error.value), f"{word!r} not in: {error.value}"
    for name, value in overrides.items():
        assert getattr(config, name) == value, f"use_mok changed {name}"
    if kind == "core":  # refused before use_mok changed anything
        assert config.moe_token_dispatcher_type == "alltoall"


def test_use_mok_changes_nothing_where_it_refuses_a_core_config(tmp_path):
    recipe = recipe_file(tmp_path, backend="reference")
    config = moe_config("core", add_bias_linear=True)
    with pytest.raises(MokConfigError):
        use_mok(config, recipe=recipe)
    assert config.moe_token_dispatcher_type == "alltoall"
    assert active_recipe().name == "bf16"  # the default: the refused call selected nothing


def test_use_mok_takes_the_mxfp8_recipe(kind):
    config = moe_config(kind, bf16=True)
    use_mok(config, recipe="mxfp8")
    finalize(config)
    assert active_recipe().precision == "mxfp8" and config.moe_token_dispatcher_type == "mok"


def test_bridge_configs_are_checked_as_finalize_leaves_them():
    # Bridge's finalize() sets the expert TP size to 1 where EP > 1 and it is unset; megatron-core
    # would copy the TP size (2), which mok refuses. Checked before finalize(), the config would
    # be refused for a setting it does not end up with.
    if bridge_missing() is not None:
        pytest.skip(bridge_missing())
    config = moe_config("bridge", tensor_model_parallel_size=2, sequence_parallel=True,
                        expert_model_parallel_size=2)
    use_mok(config)
    finalize(config)
    assert config.expert_tensor_parallel_size == 1 and config.moe_token_dispatcher_type == "mok"


def test_use_mok_refuses_a_config_without_moe_layers():
    config = moe_config("core", num_moe_experts=None, moe_ffn_hidden_size=None)
    with pytest.raises(MokConfigError, match="num_moe_experts is not set"):
        use_mok(config)


def test_use_mok_takes_the_model_config_not_the_container():
    class ConfigContainer:  # Bridge's holds the model config as .model
        model = moe_config("deferred")

    with pytest.raises(TypeError, match="pass cfg.model"):
        use_mok(ConfigContainer())


def test_a_layer_built_from_a_use_mok_config_runs_mok(tmp_path):
    recipe = recipe_file(tmp_path, backend="reference")
    kinds = [k for k in KINDS if k != "bridge" or bridge_missing() is None]
    (results,) = run_distributed(1, megatron_workers.selected_through_use_mok, kinds, recipe)
    assert list(results) == kinds
    for kind, r in results.items():
        assert r["dispatcher"] == "MokTokenDispatcher", kind
        assert r["layer_recipe"] == r["active_recipe"] == recipe, kind
        torch.testing.assert_close(r["mok"], r["alltoall"], msg=lambda m: f"{kind}: {m}")
