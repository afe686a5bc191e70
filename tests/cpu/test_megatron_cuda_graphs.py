"""Megatron's CUDA graphs with ``mok``: which ``--cuda-graph-impl`` / ``--cuda-graph-modules``
combinations a ``mok`` config accepts, that every other one is refused with its reason, and that
the dispatcher hands Megatron's partial ('moe_router') graphs everything its experts step needs.
Capture and replay themselves need a GPU: tests/gpu/test_megatron_graph_replay.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.training")

from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

import megatron_workers  # noqa: E402
from megatron_harness import MOK_CONFIG, recipe_file, run_distributed  # noqa: E402
from mok_megatron.megatron import register  # noqa: E402
from mok_megatron.megatron.validation import MokConfigError  # noqa: E402

VALID = MOK_CONFIG

# (TransformerConfig overrides, recipe fields or None for the default recipe)
ACCEPTED = {
    "local_whole_layer_default": (dict(cuda_graph_impl="local"), None),
    "local_whole_layer_empty": (dict(cuda_graph_impl="local", cuda_graph_modules=[]), None),
    "local_attn": (dict(cuda_graph_impl="local", cuda_graph_modules=["attn"]), None),
    "local_moe_router": (dict(cuda_graph_impl="local", cuda_graph_modules=["moe_router"]), None),
    "local_moe_preprocess": (
        dict(cuda_graph_impl="local", cuda_graph_modules=["moe_router", "moe_preprocess"]), None),
    "local_attn_moe_router": (
        dict(cuda_graph_impl="local", cuda_graph_modules="attn,moe_router"), None),
    "local_deprecated_flag": (dict(enable_cuda_graph=True), None),
    "local_deprecated_scope": (dict(cuda_graph_impl="local", cuda_graph_scope=["attn"]), None),
    "local_whole_layer_cuda_backend": (
        dict(cuda_graph_impl="local", bf16=True, params_dtype=torch.bfloat16),
        dict(backend="cuda")),
    # The fused call runs eagerly between the router and postprocess graphs.
    "local_moe_router_reference_backend": (
        dict(cuda_graph_impl="local", cuda_graph_modules=["moe_router"]),
        dict(backend="reference")),
}

# Megatron's full-iteration capture needs a PyTorch with this (pytorch/pytorch#180090).
FULL_ITERATION_CAPTURABLE = hasattr(torch.autograd.graph, "set_override_stale_capture_stream")
FULL_ITERATION = {
    "full_iteration": (dict(cuda_graph_impl="full_iteration", cuda_graph_warmup_steps=1), None),
    "full_iteration_deprecated_scope": (dict(cuda_graph_modules="full_iteration"), None),
}
if FULL_ITERATION_CAPTURABLE:
    ACCEPTED.update(FULL_ITERATION)

DROP_AND_PAD = dict(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)

# (TransformerConfig overrides, recipe fields, words the error must contain: setting, way out)
REFUSED = {
    "transformer_engine": (
        dict(cuda_graph_impl="transformer_engine"), None,
        ["cuda_graph_impl='transformer_engine'", "make_graphed_callables",
         "--cuda-graph-impl local"]),
    "transformer_engine_deprecated_flag": (
        dict(external_cuda_graph=True), None,
        ["--external-cuda-graph", "--cuda-graph-impl local"]),
    # With drop-and-pad, which Megatron itself requires for the 'moe' scope (and mok refuses
    # too), so that mok's reason is the one reported whether it checks before or after
    # Megatron's __post_init__.
    "local_moe": (
        dict(cuda_graph_impl="local", cuda_graph_modules=["moe"], **DROP_AND_PAD), None,
        ["cuda_graph_modules 'moe'", "--moe-pad-expert-input-to-capacity",
         "leave --cuda-graph-modules empty", "'moe_router'"]),
    "local_attn_moe": (
        dict(cuda_graph_impl="local", cuda_graph_modules=["attn", "moe"], **DROP_AND_PAD), None,
        ["cuda_graph_modules 'moe'", "leave --cuda-graph-modules empty"]),
    "full_iteration_without_warmup": (
        dict(cuda_graph_impl="full_iteration", cuda_graph_warmup_steps=0), None,
        ["cuda_graph_warmup_steps=0", "symmetric workspace", "--cuda-graph-warmup-steps 1"]),
    "local_whole_layer_reference_backend": (
        dict(cuda_graph_impl="local"), dict(backend="reference"),
        ["cuda_graph_impl='local'", "backend 'reference'", "backend cuda",
         "--cuda-graph-impl none"]),
    "local_attn_reference_backend": (
        dict(cuda_graph_impl="local", cuda_graph_modules=["attn"]), dict(backend="reference"),
        ["backend 'reference'", "backend cuda"]),
    "full_iteration_reference_backend": (
        dict(cuda_graph_impl="full_iteration"), dict(backend="reference"),
        ["cuda_graph_impl='full_iteration'", "backend 'reference'"]),
    "local_whole_layer_checked_inputs": (
        dict(cuda_graph_impl="local"), dict(backend="cuda", kernel="{check_inputs: true}"),
        ["kernel.check_inputs: true", "set check_inputs: false"]),
}
if not FULL_ITERATION_CAPTURABLE:
    REFUSED.update({name: (overrides, recipe, ["set_override_stale_capture_stream",
                                               "--cuda-graph-impl local"])
                    for name, (overrides, recipe) in FULL_ITERATION.items()})


@pytest.fixture(scope="module", autouse=True)
def registered():
    register()


@pytest.fixture(autouse=True)
def no_recipe_env(monkeypatch):
    monkeypatch.delenv("MOK_RECIPE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def use_recipe(monkeypatch, tmp_path, fields) -> None:
    if fields is not None:
        monkeypatch.setenv("MOK_RECIPE", recipe_file(tmp_path, **fields))


# megatron-core 0.17 names the modules field cuda_graph_scope and spells the full-iteration
# graph as that scope under cuda_graph_impl='local'.
OLD_SPELLING = "cuda_graph_modules" not in TransformerConfig.__dataclass_fields__


def _config(overrides: dict) -> TransformerConfig:
    values = {**VALID, **overrides}
    if OLD_SPELLING:
        modules = values.pop("cuda_graph_modules", None)
        if values.get("cuda_graph_impl") == "full_iteration":
            values["cuda_graph_impl"] = "local"
            modules = ["full_iteration"] + list(modules or [])
        if modules is not None:
            values["cuda_graph_scope"] = modules
    return TransformerConfig(**values)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:enable_cuda_graph")
@pytest.mark.parametrize("case", list(ACCEPTED))
def test_accepted_combination_builds(case, monkeypatch, tmp_path):
    overrides, recipe = ACCEPTED[case]
    use_recipe(monkeypatch, tmp_path, recipe)
    config = _config(overrides)
    assert config.cuda_graph_impl in ("local", "full_iteration")


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_combination_names_its_reason(case, monkeypatch, tmp_path):
    overrides, recipe, words = REFUSED[case]
    use_recipe(monkeypatch, tmp_path, recipe)
    with pytest.raises(MokConfigError) as error:
        _config(overrides)
    for word in words:
        assert word in str(error.value), f"{word!r} not in: {error.value}"


def test_other_dispatchers_keep_megatrons_rules():
    TransformerConfig(**{**VALID, "moe_token_dispatcher_type": "alltoall",
                         "cuda_graph_impl": "transformer_engine"})


def test_moe_router_graphs_hand_the_routing_to_the_experts():
    """A replay of the router graph runs no Python: the experts step must get the routing
    from the graph's outputs (the dispatcher's cudagraph_attrs), and then gives the eager
    layer's results bit for bit."""
    (result,) = run_distributed(1, megatron_workers.moe_router_graph_stages)
    assert result["cudagraph_attrs"] == ["routing_map"]
    replayed, eager = result["replayed"], result["eager"]
    assert torch.equal(replayed["y"], eager["y"])
    assert torch.equal(replayed["dx"], eager["dx"])
    assert replayed["grads"].keys() == eager["grads"].keys()
    assert any(".experts." in name for name in eager["grads"])
    for name, grad in eager["grads"].items():
        assert torch.equal(replayed["grads"][name], grad), name
