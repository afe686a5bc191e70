"""Config layer: every shipped YAML loads, broken ones fail naming file and key, and every
resolved Megatron flag is accepted by megatron-core's own argument parser."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from mok_megatron.config import (CONFIG_DIR, ConfigError, KernelKnobs, Recipe, list_configs,
                                 load_dispatcher, load_model, load_recipe, main,
                                 resolve_megatron_args)

LOADERS: dict[str, Callable[[Any], Any]] = {
    "recipes": load_recipe, "dispatchers": load_dispatcher, "models": load_model}
SHIPPED = sorted(CONFIG_DIR.glob("*/*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_config_loads(path: Path) -> None:
    config = LOADERS[path.parent.name](path.stem)
    assert config.name == path.stem
    assert LOADERS[path.parent.name](path) == config  # by path, the same object


def test_all_expected_configs_ship() -> None:
    assert list_configs("recipes") == ["bf16", "fp8_blockwise", "mxfp8"]
    assert list_configs("dispatchers") == ["alltoall", "hybridep", "mok"]
    assert list_configs("models") == ["deepseek_v3_like", "gpt_oss_20b_like", "mixtral_8x7b_like",
                                      "mok_bench", "qwen3_30b_a3b_like", "tiny"]


@pytest.mark.parametrize("name", ["bf16", "mxfp8", "fp8_blockwise"])
def test_recipes_state_every_knob(name: str) -> None:
    raw = yaml.safe_load((CONFIG_DIR / "recipes" / f"{name}.yaml").read_text())
    assert list(raw["kernel"]) == [f.name for f in dataclasses.fields(KernelKnobs)]
    recipe = load_recipe(name)
    assert recipe.precision == name and recipe.kernel == KernelKnobs()


def test_recipe_megatron_args() -> None:
    assert load_recipe("bf16").megatron_args == ("--bf16",)
    # Hopper: TE's MXFP8 (--fp8-recipe mxfp8) needs Blackwell, so the rest of the model
    # stays BF16 and no fp8 flag is emitted.
    assert load_recipe("mxfp8").megatron_args == ("--bf16",)
    assert load_recipe("mxfp8").megatron_args_with_te is None
    # TE's blockwise FP8 runs on Hopper: with TE the rest of the model follows the experts.
    blockwise = load_recipe("fp8_blockwise")
    assert blockwise.megatron_args == ("--bf16",)
    assert blockwise.megatron_args_with_te == ("--bf16", "--fp8-format", "e4m3", "--fp8-recipe",
                                               "blockwise")


@pytest.mark.parametrize("name, hidden, ffn, experts, topk, shared, ep64", [
    ("tiny", 64, 32, 8, 2, 32, 2),
    ("mok_bench", 7168, 3072, 384, 6, 3072, 6),
    ("deepseek_v3_like", 7168, 2048, 256, 8, 2048, 8),
    ("qwen3_30b_a3b_like", 2048, 768, 128, 8, None, 8),
])
def test_model_shapes(name: str, hidden: int, ffn: int, experts: int, topk: int,
                      shared: int | None, ep64: int) -> None:
    m = load_model(name)
    assert (m.hidden_size, m.moe_ffn_hidden_size, m.num_experts, m.topk,
            m.shared_expert_intermediate_size, m.bench.ep64_experts_per_gpu,
            m.activation) == (hidden, ffn, experts, topk, shared, ep64, "swiglu")


def test_ep64_equivalent() -> None:
    m = load_model("mok_bench").ep64_equivalent(ep_size=2)
    assert (m.num_experts, m.hidden_size, m.topk, m.name) == (12, 7168, 6, "mok_bench-ep64eq")
    with pytest.raises(ValueError, match="no EP64-equivalent"):
        load_model("tiny").ep64_equivalent(ep_size=0)


# ---- broken files -------------------------------------------------------------------------

def _shipped(kind: str, name: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / kind / f"{name}.yaml").read_text())


def _set(data: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        data = data[p]
    if value is _DELETE:
        del data[last]
    else:
        data[last] = value


_DELETE = object()

BROKEN = [
    # (kind, base config, dotted key, new value, key named in the error, problem)
    ("recipes", "bf16", "kernel.comm_sm", 4, "kernel.comm_sm",
     "unknown key (did you mean 'comm_sms_forward'?)"),
    ("recipes", "bf16", "name", "x", "name", "unknown key"),
    ("recipes", "bf16", "kernel.comm_sms_forward", "x", "kernel.comm_sms_forward",
     "expected int, got str 'x'"),
    ("recipes", "bf16", "kernel.minibatch_tokens", True, "kernel.minibatch_tokens",
     "expected int, got bool True"),
    ("recipes", "bf16", "kernel.check_inputs", 1, "kernel.check_inputs",
     "expected bool, got int 1"),
    ("recipes", "bf16", "kernel.schedule_capacity", 0, "kernel.schedule_capacity",
     "must be > 0.0, got 0.0"),
    ("recipes", "bf16", "precision", "fp4", "precision",
     "expected one of 'bf16', 'mxfp8', 'fp8_blockwise'"),
    ("recipes", "bf16", "kernel.comm_sms_forward", 133, "kernel.comm_sms_forward",
     "must be <= 131, got 133"),
    ("recipes", "bf16", "kernel.comm_sms_backward", 0, "kernel.comm_sms_backward",
     "must be >= 1, got 0"),
    ("recipes", "bf16", "kernel.minibatch_tokens", 32768, "kernel.minibatch_tokens",
     "must be <= macrobatch_tokens (16384), got 32768"),
    ("recipes", "bf16", "kernel.backward_kernel", "fused", "kernel.backward_kernel",
     "expected one of 'auto', 'separate', 'megakernel'"),
    ("recipes", "bf16", "kernel.schedule_capacity", 2.0, "kernel.schedule_capacity",
     "must be <= 1.0, got 2.0"),
    ("recipes", "bf16", "kernel.backward_inputs", "dropped", "kernel.backward_inputs",
     "expected one of 'saved', 'recomputed'"),
    ("recipes", "bf16", "kernel.kept_h_tokens", -128, "kernel.kept_h_tokens",
     "must be >= 0, got -128"),
    ("recipes", "bf16", "kernel", [1], "kernel", "expected a mapping, got list [1]"),
    ("recipes", "bf16", "kernel.mxfp8_weights", "codes", "kernel.mxfp8_weights",
     "only precision mxfp8 reads it (this recipe's is bf16): leave it at auto"),
    ("recipes", "mxfp8", "kernel.mxfp8_weights", "fp8", "kernel.mxfp8_weights",
     "expected one of 'auto', 'codes', 'rounded'"),
    ("recipes", "bf16", "megatron_args.bf16", False, "megatron_args.bf16",
     "expected true (a bare flag)"),
    ("recipes", "bf16", "megatron_args.--bf16", True, "megatron_args.--bf16",
     "a flag name is lower-case words joined by '-', without dashes in front"),
    ("models", "tiny", "hidden_size", -64, "hidden_size", "must be >= 1, got -64"),
    ("models", "tiny", "num_experts", 0, "num_experts", "must be >= 1, got 0"),
    ("models", "tiny", "topk", 9, "topk", "must be <= num_experts (8), got 9"),
    ("models", "tiny", "num_attention_heads", 3, "num_attention_heads",
     "must divide hidden_size (64)"),
    ("models", "tiny", "shared_expert_intermediate_size", 0, "shared_expert_intermediate_size",
     "must be >= 1, got 0"),
    ("models", "tiny", "hidden_size", _DELETE, "hidden_size", "missing required key"),
    ("models", "tiny", "bench.ep64_experts_per_gpu", _DELETE, "bench.ep64_experts_per_gpu",
     "missing required key"),
    ("models", "tiny", "bench.tokens_per_gpu", [16, "x"], "bench.tokens_per_gpu[1]",
     "expected int, got str 'x'"),
    ("models", "tiny", "bench.tokens_per_gpu", [], "bench.tokens_per_gpu", "must not be empty"),
    ("models", "tiny", "hidden_size", None, "hidden_size", "expected int, got null"),
    ("dispatchers", "alltoall", "megatron_args.moe-token-dispatcher-type", _DELETE,
     "megatron_args", "must set moe-token-dispatcher-type"),
    ("dispatchers", "hybridep", "install_hint", _DELETE, "install_hint",
     "requires and install_hint go together"),
    ("dispatchers", "mok", "description", _DELETE, "description", "missing required key"),
]


@pytest.mark.parametrize("kind, base, dotted, value, key, problem", BROKEN,
                         ids=[f"{c[1]}:{c[2]}={c[3] if c[3] is not _DELETE else 'deleted'}"
                              for c in BROKEN])
def test_broken_file_names_file_and_key(tmp_path: Path, kind: str, base: str, dotted: str,
                                        value: Any, key: str, problem: str) -> None:
    data = _shipped(kind, base)
    _set(data, dotted, value)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        LOADERS[kind](path)
    assert str(err.value).startswith(f"{path}: {key}: {problem}")


# Knobs only some kernel paths read: (setting, value, the paths set first, problem).
SEPARATE = {"kernel.forward_kernel": "separate", "kernel.backward_kernel": "separate"}
UNREAD = [
    ("kernel.minibatch_tokens", 256, SEPARATE, "only the megakernels read it: leave it at 128"),
    ("kernel.comm_sms_backward", 32, {"kernel.backward_kernel": "separate"},
     "only backward_kernel: megakernel (or auto) reads it: leave it at 16"),
    ("kernel.macrobatch_tokens", 32768, SEPARATE,
     "only a megakernel with backward_inputs: recomputed reads it: leave it at 16384"),
    ("kernel.kept_h_tokens", 4096, {"kernel.backward_inputs": "saved"},
     "only backward_inputs: recomputed reads it (saved inputs keep every row's h): leave it "
     "at 0"),
    ("kernel.kept_h_tokens", 4096, {"kernel.backward_kernel": "megakernel"},
     "the backward megakernel recomputes every macrobatch of its ring; only the separate "
     "backward reads kept h: set backward_kernel to separate or auto, or leave it at 0"),
]


@pytest.mark.parametrize("dotted, value, paths, problem", UNREAD,
                         ids=[f"{c[0]}={c[1]}:{','.join(c[2].values())}" for c in UNREAD])
def test_knob_no_path_reads_is_refused(tmp_path: Path, dotted: str, value: Any, paths: dict,
                                       problem: str) -> None:
    """A knob moved from its default where the recipe's kernel paths never read it; with the
    paths at auto (the shipped recipes) a megakernel may run, so the knob is read."""
    data = _shipped("recipes", "bf16")
    _set(data, dotted, value)
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(data))
    assert LOADERS["recipes"](path).kernel.forward_kernel == "auto"
    for key, kernel in paths.items():
        _set(data, key, kernel)
    path = tmp_path / "unread.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        LOADERS["recipes"](path)
    assert str(err.value).startswith(f"{path}: {dotted}: {problem}")


def test_error_message_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "bf16.yaml"
    text = (CONFIG_DIR / "recipes" / "bf16.yaml").read_text()
    path.write_text(text.replace("comm_sms_forward: 16", "comm_sms_forward: x"))
    monkeypatch.chdir(tmp_path)  # files under the working directory are shown relative to it
    with pytest.raises(ConfigError) as err:
        load_recipe(path)
    assert str(err.value) == "configs/bf16.yaml: kernel.comm_sms_forward: expected int, got str 'x'"


@pytest.mark.parametrize("text, problem", [
    ("precision: bf16\nprecision: mxfp8\n", "duplicate key 'precision'"),
    ("precision: [bf16\n", "invalid YAML"),
    ("", "expected a mapping, got null"),
])
def test_unreadable_files(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem) as err:
        load_recipe(path)
    assert str(err.value).startswith(f"{path}: ")


def test_unknown_name_lists_available() -> None:
    with pytest.raises(ConfigError, match=r"no such file; available models: .*mok_bench"):
        load_model("mok_bench_typo")


def test_partial_recipe_takes_defaults_and_reloads_by_name(tmp_path: Path) -> None:
    path = tmp_path / "fast.yaml"
    path.write_text("precision: bf16\nkernel:\n  comm_sms_forward: 24\n")
    recipe = load_recipe(path)
    assert recipe == Recipe(name=str(path), kernel=KernelKnobs(comm_sms_forward=24))
    assert load_recipe(recipe.name) == recipe  # what --mok-recipe relies on


def test_check_available(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    base = "description: d\nmegatron_args: {moe-token-dispatcher-type: alltoall}\n"
    path.write_text(base + "requires: json.NoSuchThing\ninstall_hint: pip install it\n")
    with pytest.raises(ImportError, match="needs json.NoSuchThing: pip install it"):
        load_dispatcher(path).check_available()
    path.write_text(base + "requires: json.dumps\ninstall_hint: ships with Python\n")
    load_dispatcher(path).check_available()
    load_dispatcher("mok").check_available()


# ---- resolved arguments -------------------------------------------------------------------

EXPECTED_DISPATCHER_ARGS = {
    "mok": ["--moe-token-dispatcher-type", "mok", "--mok-recipe", "bf16"],
    "alltoall": ["--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"],
    "hybridep": ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
                 "hybridep", "--moe-router-dtype", "fp32"],
}


@pytest.mark.parametrize("dispatcher", sorted(EXPECTED_DISPATCHER_ARGS))
def test_resolve_megatron_args(dispatcher: str) -> None:
    args = resolve_megatron_args(load_recipe("bf16"), load_dispatcher(dispatcher),
                                 load_model("tiny"))
    model_args = ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
                  "--num-attention-heads", "4", "--seq-length", "64",
                  "--max-position-embeddings", "64", "--num-experts", "8",
                  "--moe-ffn-hidden-size", "32", "--moe-router-topk", "2",
                  "--moe-shared-expert-intermediate-size", "32", "--swiglu",
                  "--disable-bias-linear"]
    assert args == model_args + ["--bf16"] + EXPECTED_DISPATCHER_ARGS[dispatcher]


def test_no_shared_expert_flag_without_shared_expert() -> None:
    assert "--moe-shared-expert-intermediate-size" not in (
        load_model("qwen3_30b_a3b_like").megatron_args())


def test_flag_set_twice_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("precision: bf16\nmegatron_args: {moe-router-dtype: fp64}\n")
    with pytest.raises(ConfigError, match=r"--moe-router-dtype is set by both recipe .* and "
                                          r"dispatcher 'hybridep'"):
        resolve_megatron_args(load_recipe(path), load_dispatcher("hybridep"), load_model("tiny"))


@pytest.fixture(scope="module")
def megatron_parsers() -> dict[bool, argparse.ArgumentParser]:
    """Megatron's real parser, stock (False) and with the mok adapter's additions (True)."""
    arguments = pytest.importorskip("megatron.training.arguments")
    parsers = {}
    for with_adapter in (False, True):
        parser = argparse.ArgumentParser(allow_abbrev=False)
        with warnings.catch_warnings():  # Megatron's own argparse deprecations, not ours
            warnings.simplefilter("ignore", DeprecationWarning)
            arguments.add_megatron_arguments(parser)
        if with_adapter:
            # The 'mok' choice and the --mok-recipe flag the adapter registers.
            action = parser._option_string_actions["--moe-token-dispatcher-type"]
            action.choices = (*action.choices, "mok")
            parser.add_argument("--mok-recipe")
        parsers[with_adapter] = parser
    return parsers


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8", "fp8_blockwise"])
@pytest.mark.parametrize("model", ["tiny", "mok_bench", "deepseek_v3_like", "qwen3_30b_a3b_like"])
@pytest.mark.parametrize("dispatcher", ["mok", "alltoall", "hybridep"])
def test_megatron_parser_accepts_every_flag(megatron_parsers: dict[bool, argparse.ArgumentParser],
                                            recipe: str, model: str, dispatcher: str) -> None:
    r, d, m = load_recipe(recipe), load_dispatcher(dispatcher), load_model(model)
    # Only the mok dispatcher needs the adapter's additions; the baselines use stock Megatron.
    args = megatron_parsers[dispatcher == "mok"].parse_args(
        resolve_megatron_args(r, d, m, have_te=False))
    assert (args.num_layers, args.hidden_size, args.ffn_hidden_size, args.num_attention_heads,
            args.seq_length, args.max_position_embeddings) == (
        m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.seq_length,
        m.max_position_embeddings)
    assert (args.num_experts, args.moe_ffn_hidden_size, args.moe_router_topk,
            args.moe_shared_expert_intermediate_size) == (
        m.num_experts, m.moe_ffn_hidden_size, m.topk, m.shared_expert_intermediate_size)
    assert args.swiglu and not args.add_bias_linear and args.bf16
    assert args.moe_token_dispatcher_type == d.megatron_args[1]
    assert args.fp8 is None  # without TE every recipe leaves the rest of the model in BF16


@pytest.mark.parametrize("dispatcher", ["mok", "alltoall"])
def test_fp8_blockwise_with_te_runs_tes_blockwise_recipe(
        megatron_parsers: dict[bool, argparse.ArgumentParser], dispatcher: str) -> None:
    """With Transformer Engine the rest of the model (and alltoall's experts) run TE's
    blockwise FP8; the bf16 and mxfp8 recipes emit the same flags either way."""
    r, d, m = load_recipe("fp8_blockwise"), load_dispatcher(dispatcher), load_model("tiny")
    args = megatron_parsers[dispatcher == "mok"].parse_args(
        resolve_megatron_args(r, d, m, have_te=True))
    assert (args.fp8, args.fp8_recipe, args.bf16) == ("e4m3", "blockwise", True)
    for name in ("bf16", "mxfp8"):
        recipe = load_recipe(name)
        assert (resolve_megatron_args(recipe, d, m, have_te=True)
                == resolve_megatron_args(recipe, d, m, have_te=False))


# ---- command line -------------------------------------------------------------------------

def test_cli_prints_resolved_args(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--recipe", "bf16", "--dispatcher", "mok", "--model", "tiny"]) == 0
    expected = resolve_megatron_args(load_recipe("bf16"), load_dispatcher("mok"),
                                     load_model("tiny"))
    assert shlex.split(capsys.readouterr().out) == expected


def test_cli_list_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "recipes: bf16 fp8_blockwise mxfp8" in out
    assert "dispatchers: alltoall hybridep mok" in out
    assert main(["--recipe", "nope", "--dispatcher", "mok", "--model", "tiny"]) == 1
    assert ("no such file; available recipes: bf16, fp8_blockwise, mxfp8"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["--recipe", "bf16"])


def test_cli_runs_as_module() -> None:
    run = subprocess.run([sys.executable, "-m", "mok_megatron.config", "--recipe", "mxfp8",
                          "--dispatcher", "hybridep", "--model", "qwen3_30b_a3b_like"],
                         capture_output=True, text=True, check=True, cwd=CONFIG_DIR.parent)
    assert "--moe-flex-dispatcher-backend hybridep" in run.stdout


def test_cuda_precisions_are_the_ones_the_cuda_backend_builds_operands_for():
    """config.CUDA_PRECISIONS (what the backend accepts) and symm_moe's operand table (what it
    runs) name the same precisions: one cannot grow without the other."""
    from mok_megatron.cuda import symm_moe
    from mok_megatron.config import CUDA_PRECISIONS

    assert set(CUDA_PRECISIONS) == {"bf16", *symm_moe.QUANTIZED_OPERANDS}


def test_mxfp8_weight_form_auto_picks_by_rows_per_local_expert():
    """kernel.mxfp8_weights: auto keeps rounded bf16 weights from MXFP8_ROUNDED_MIN_ROWS
    average rows per local expert (tokens x topk / local experts) up, codes below; a forced
    form is kept whatever the shape."""
    from mok_megatron.config import MXFP8_ROUNDED_MIN_ROWS, KernelKnobs, Recipe
    from mok_megatron.cuda.mxfp8_weights import quantize_pair, round_pair
    from mok_megatron.cuda.symm_moe import mxfp8_weight_form, quantized_operands

    auto = Recipe(precision="mxfp8")
    at = MXFP8_ROUNDED_MIN_ROWS
    assert mxfp8_weight_form(auto, at, 8, 8) == "rounded"  # exactly the threshold
    assert mxfp8_weight_form(auto, at - 1, 8, 8) == "codes"
    assert mxfp8_weight_form(auto, 2048, 8, 256) == "codes"  # 64 rows per expert
    assert quantized_operands(auto, 4096, 8, 8)[1] is round_pair
    assert quantized_operands(auto, 64, 8, 8)[1] is quantize_pair
    for form in ("codes", "rounded"):
        forced = Recipe(precision="mxfp8", kernel=KernelKnobs(mxfp8_weights=form))
        assert {mxfp8_weight_form(forced, t, 8, 8) for t in (1, 4096, 10**6)} == {form}


def test_mxfp8_weight_form_is_logged_once_per_call_shape(caplog):
    """auto's pick is said (INFO, mok_megatron.cuda.symm_moe) the first time a call shape meets it,
    not at every call."""
    import logging

    from mok_megatron.config import Recipe
    from mok_megatron.cuda.symm_moe import quantized_operands

    auto = Recipe(precision="mxfp8")
    with caplog.at_level(logging.INFO, logger="mok_megatron.cuda.symm_moe"):
        for _ in range(3):
            quantized_operands(auto, 1000, 8, 4)  # 2000 rows per expert: rounded
        quantized_operands(auto, 24, 8, 4)  # 48: codes
    said = [r.getMessage() for r in caplog.records if r.name == "mok_megatron.cuda.symm_moe"]
    assert len(said) == 2, said
    assert "weights as rounded for 1000 tokens" in said[0] and "2000 rows" in said[0]
    assert "weights as codes for 24 tokens" in said[1]


@pytest.mark.parametrize("precision", ["bf16", "mxfp8", "fp8_blockwise"])
@pytest.mark.parametrize("backward_inputs", ["recomputed", "saved"])
def test_auto_kernels_resolve_by_the_stated_rule(precision, backward_inputs):
    """auto: the forward megakernel at EP = 1 where the recipe allows it (an FP8 recipe's needs
    recomputed inputs), the separate backward; separate everywhere at EP > 1; explicit choices
    stay. What it resolves to never breaks the recipe's own checks."""
    from mok_megatron.config import recipe_problems, resolve_kernels

    recipe = Recipe(precision=precision, kernel=KernelKnobs(backward_inputs=backward_inputs))
    assert (recipe.kernel.forward_kernel, recipe.kernel.backward_kernel) == ("auto", "auto")
    fp8_saved = precision != "bf16" and backward_inputs == "saved"
    for world, forward in ((1, "separate" if fp8_saved else "megakernel"), (2, "separate"),
                           (4, "separate")):
        resolved = resolve_kernels(recipe, world)
        assert (resolved.kernel.forward_kernel, resolved.kernel.backward_kernel) == \
            (forward, "separate"), world
        assert next(recipe_problems(resolved), None) is None
        assert dataclasses.replace(resolved, kernel=recipe.kernel) == recipe  # nothing else
    explicit = dataclasses.replace(recipe, kernel=dataclasses.replace(
        recipe.kernel, forward_kernel="separate", backward_kernel="megakernel"))
    assert resolve_kernels(explicit, 1) is explicit
