"""The support matrix of the ``mok`` dispatcher, checked when Megatron builds its
``TransformerConfig`` (that is, at configuration time, before any model exists).

Every setting ``mok`` does not implement is refused with a ``MokConfigError`` that names the
setting (as a config field and as its command-line flag) and says what to do instead. All
problems of one config are reported together. Settings that only tune Megatron's own
communication overlap are refused too, with the reason that ``mok`` does not need them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
from typing import Iterator, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..config import CUDA_PRECISIONS, FP8_PRECISIONS, Recipe, no_cuda_kernels

MOK = "mok"
_ALTERNATIVE = "or use --moe-token-dispatcher-type alltoall (or flex)"

_HYBRIDEP_INSTALL = (
    "build DeepEP's hybrid-ep branch from source (https://github.com/deepseek-ai/DeepEP, branch "
    "hybrid-ep, docs/README_Hybrid-EP.md; intranode builds need no NVSHMEM) into this environment"
)


class MokConfigError(ValueError):
    """A Megatron setting that the ``mok`` dispatcher does not support."""


def uses_mok(config) -> bool:
    """True where the config selects our megakernel, in either spelling: the dispatcher type
    ``mok`` (Megatron-Core 0.19) or ``moe_megakernel_backend: mok`` (newer Megatron)."""
    return (
        config.moe_token_dispatcher_type == MOK
        or getattr(config, "moe_megakernel_backend", None) == MOK
    )


def activation_name(config) -> str:
    """Name (in ``mok_megatron.activations``) of the expert activation the config describes."""
    from megatron.core.activations import squared_relu

    func, gated = config.activation_func, config.gated_linear_unit
    names = {
        (F.silu, True): "swiglu",
        (F.gelu, True): "geglu",
        (F.silu, False): "silu",
        (F.gelu, False): "gelu",
        (F.relu, False): "relu",
        (squared_relu, False): "squared_relu",
    }
    name = names.get((func, gated))
    if name is None:
        raise MokConfigError(
            f"activation_func={getattr(func, '__name__', func)} with gated_linear_unit={gated} "
            f"is not implemented by mok (supported: --swiglu, geglu, gelu, relu, silu, "
            f"--squared-relu); {_ALTERNATIVE}"
        )
    return name


# Megatron's deprecated spellings that its __post_init__ turns into a setting checked here
# (0.18 and 0.19 alike): a refusal names the setting, the note names what the user wrote.
_DEPRECATED_SPELLINGS = {
    "enable_cuda_graph": "cuda_graph_impl",
    "external_cuda_graph": "cuda_graph_impl",
    "moe_router_padding_for_fp8": "moe_router_padding_for_quantization",
}


def check_config(config, recipe: Recipe, cause: Optional[BaseException] = None) -> None:
    """Raise ``MokConfigError`` listing every unsupported setting of a ``mok`` config (raised
    from ``cause``, where Megatron's own check refused the config first)."""
    problems = list(_problems(config, recipe))
    if not problems:
        return
    lines = [f"  - {p}" for p in problems]
    lines += [
        f"  note: {old}=True, which this config sets, is Megatron's deprecated spelling of {new}"
        for old, new in _DEPRECATED_SPELLINGS.items()
        if getattr(config, old, False) and any(new in p for p in problems)
    ]
    raise MokConfigError(
        "--moe-token-dispatcher-type mok cannot run this config:\n" + "\n".join(lines)
    ) from cause


def _problems(config, recipe: Recipe) -> Iterator[str]:
    etp = config.expert_tensor_parallel_size or config.tensor_model_parallel_size
    if etp > 1:
        yield (
            f"expert_tensor_parallel_size={etp} (--expert-tensor-parallel-size; it defaults to "
            f"--tensor-model-parallel-size): mok runs whole experts on each EP rank; set "
            f"--expert-tensor-parallel-size 1, {_ALTERNATIVE}"
        )
    gpus_per_node = _gpus_per_node()
    ep = config.expert_model_parallel_size
    if _may_use_kernels(recipe) and gpus_per_node is not None and ep > gpus_per_node:
        yield (
            f"expert_model_parallel_size={ep} (--expert-model-parallel-size) spans more GPUs than "
            f"one node has ({gpus_per_node}): mok's kernels need the EP group inside one NVLink "
            f"domain; use --moe-token-dispatcher-type alltoall or flex for EP across nodes"
        )
    not_needed = {
        "moe_shared_expert_overlap": "--moe-shared-expert-overlap",
        "overlap_moe_expert_parallel_comm": "--overlap-moe-expert-parallel-comm",
        "delay_wgrad_compute": "--delay-wgrad-compute",
        "overlap_dispatch_backward_with_experts_wgrad":
            "--overlap-dispatch-backward-with-experts-wgrad",
    }
    for name, flag in not_needed.items():
        if getattr(config, name, False):
            yield (
                f"{name} ({flag}) is not needed: mok's kernel overlaps token communication with "
                f"the expert GEMMs itself, and the shared expert runs on Megatron's own path; "
                f"remove {flag}"
            )
    if config.moe_router_padding_for_quantization:
        yield (
            "moe_router_padding_for_quantization (--moe-router-padding-for-quantization) is not "
            "needed: mok's kernel sizes its own expert tiles; remove the flag"
        )
    if config.add_bias_linear:
        yield (
            "add_bias_linear=True (Megatron's default): mok's experts have no bias; pass "
            f"--disable-bias-linear, {_ALTERNATIVE}"
        )
    if config.moe_apply_probs_on_input:
        yield (
            "moe_apply_probs_on_input (--moe-apply-probs-on-input): mok applies the router "
            f"probabilities after the activation, as Megatron does by default; remove the flag, "
            f"{_ALTERNATIVE}"
        )
    if config.moe_latent_size:
        yield f"moe_latent_size (--moe-latent-size) is not implemented by mok; {_ALTERNATIVE}"
    yield from _activation_problems(config)
    # These two settings are new in Megatron-Core 0.18; a 0.17 config has neither field.
    if getattr(config, "moe_mlp_glu_interleave_size", None) is not None:
        yield (
            "moe_mlp_glu_interleave_size (--moe-mlp-glu-interleave-size): mok reads FC1 as "
            f"[gate | up] halves; remove the flag, {_ALTERNATIVE}"
        )
    if getattr(config, "moe_single_grouped_weight", False):
        yield (
            "moe_single_grouped_weight (--moe-single-grouped-weight) is not implemented by mok; "
            f"remove the flag, {_ALTERNATIVE}"
        )
    yield from _precision_problems(config, recipe)
    if config.fp4:
        yield f"fp4 (--fp4-format) is not implemented by mok; {_ALTERNATIVE}"
    # Flex HybridEP / NCCL-EP settings (a per-rank token budget, paged stashing of the expert
    # activations); mok runs neither the flex dispatcher nor the experts' own forward.
    flex_only = {
        "moe_expert_rank_capacity_factor": "--moe-expert-rank-capacity-factor",
        "moe_paged_stash": "--moe-paged-stash",
    }
    for name, flag in flex_only.items():
        if getattr(config, name, None) not in (None, False):
            yield (
                f"{name} ({flag}) belongs to the flex dispatcher's HybridEP / NCCL-EP backends "
                f"and is not implemented by mok; remove {flag}, or use "
                f"--moe-token-dispatcher-type flex"
            )
    if config.moe_pad_expert_input_to_capacity:
        yield (
            "moe_pad_expert_input_to_capacity (--moe-pad-expert-input-to-capacity): mok needs no "
            "padded expert inputs (--moe-expert-capacity-factor alone, which drops tokens, "
            f"works); remove the flag, {_ALTERNATIVE}"
        )
    # Megatron's inference turns on padding to capacity at decode time under this flag
    # (set_decode_expert_padding), after this check, and its router then selects more than
    # top-k experts per token. Training never reads it, but megatron-core 0.17's argument
    # validation demands it for local CUDA graphs with EP > 1: accepted there, where a padded
    # routing map still stops in the conversion (routing.py) rather than run.
    if (getattr(config, "moe_pad_experts_for_cuda_graph_inference", False)
            and not _megatron_demands_decode_padding(config)):
        yield (
            "moe_pad_experts_for_cuda_graph_inference (--moe-pad-experts-for-cuda-graph-"
            "inference): Megatron then pads experts to capacity at decode time, a routing map "
            "with more than top-k experts per token, which mok does not run; remove the flag, "
            f"{_ALTERNATIVE}"
        )
    if config.moe_router_dtype == "fp64":
        yield (
            "moe_router_dtype='fp64' (--moe-router-dtype fp64): mok takes the router's "
            "probabilities in fp32, bf16 or fp16; use --moe-router-dtype fp32"
        )
    yield from _expert_weight_problems(config)
    yield from _cuda_graph_problems(config, recipe)
    if config.transformer_impl == "inference_optimized":
        yield (
            "transformer_impl='inference_optimized' (--transformer-impl): mok is a training "
            "dispatcher; use --transformer-impl transformer_engine or local"
        )
    if "moe_act" in (config.recompute_modules or []):
        yield (
            "recompute_modules 'moe_act' (--recompute-modules): the experts' activation is inside "
            "mok's fused call; recompute the whole layer with 'moe' instead"
        )
    offloaded = {"expert_fc1", "moe_act", "fused_group_mlp"} & set(config.offload_modules or [])
    if config.fine_grained_activation_offloading and offloaded:
        yield (
            f"offload_modules {sorted(offloaded)} (--offload-modules): these expert activations "
            "live inside mok's fused call; offload other modules only"
        )


def _megatron_demands_decode_padding(config) -> bool:
    from megatron.core import package_info

    return (package_info.VERSION[:2] < (0, 18) and config.cuda_graph_impl == "local"
            and config.expert_model_parallel_size > 1)


def _expert_weight_problems(config) -> Iterator[str]:
    """Settings under which the experts' weight Parameters are not the bf16 [2F, H] / [H, F]
    tensors mok's fused call reads, or under which Megatron computes the experts otherwise."""
    # Both new in 0.19: expert weights sharded further across the expert-tensor-parallel + GTP
    # axes, each rematerialized by its module's own forward (which mok never runs).
    shards = getattr(config, "expert_tensor_parallel_num_weight_shards", None)
    remat = getattr(config, "expert_gtp_weight_remat_size", 1)
    if (shards is not None and shards > 1) or remat > 1:
        yield (
            f"expert_tensor_parallel_num_weight_shards={shards} (expert_gtp_weight_remat_size="
            f"{remat}; --expert-tensor-parallel-num-weight-shards): mok reads each local "
            f"expert's whole weights; leave it unset (or 1), {_ALTERNATIVE}"
        )
    if config.fp8_param:
        yield (
            "fp8_param (--fp8-param-gather): the expert weights would be Transformer Engine "
            "quantized tensors, while mok reads bf16 weight Parameters (and quantizes them "
            "itself under its FP8 recipes); remove the flag, "
            f"{_ALTERNATIVE}"
        )
    if getattr(config, "quant_recipe", None) is not None:
        yield (
            "quant_recipe (--te-precision-config-file, --kitchen-config-file or "
            "--kitchen-recipe-number): per-module quantization of the expert linears through "
            "Transformer Engine or Kitchen, which mok's fused call does not run; the "
            "routed experts' precision comes from the mok recipe (--mok-recipe); remove the "
            f"flag, {_ALTERNATIVE}"
        )
    if config.activation_func_fp8_input_store:
        yield (
            "activation_func_fp8_input_store (--activation-func-fp8-input-store): Megatron's "
            "backward would start from the activation's input cast to FP8, mok's starts from "
            f"it in bf16 (recomputed or saved); remove the flag, {_ALTERNATIVE}"
        )


def _precision_problems(config, recipe: Recipe) -> Iterator[str]:
    if config.fp16 or config.params_dtype == torch.float16:
        yield (
            "fp16 (--fp16, or params_dtype=float16): no mok backend computes in fp16 (the kernels "
            f"run bf16); train in bf16 with --bf16, {_ALTERNATIVE}"
        )
    elif config.params_dtype != torch.bfloat16 and _may_use_kernels(recipe):
        yield (
            f"params_dtype={str(config.params_dtype).replace('torch.', '')} (no --bf16): mok's "
            f"CUDA kernels run bf16 weights and activations; train in bf16 with --bf16, or run "
            f"the experts on the PyTorch reference with backend: reference in the recipe, "
            f"{_ALTERNATIVE}"
        )
    if getattr(config, "enable_autocast", False):
        yield (
            "enable_autocast (torch.autocast around the forward): alltoall's expert GEMMs would "
            "run in the autocast dtype from the stored weights, mok's read the weights as "
            f"stored; keep bf16 parameters (--bf16) instead, {_ALTERNATIVE}"
        )
    if (config.fp8 and recipe.precision in FP8_PRECISIONS
            and config.transformer_impl == "local"):
        yield (
            f"fp8={config.fp8!r} (--fp8-format) with --transformer-impl local: alltoall's local "
            f"expert linears ignore FP8 and run bf16, the {recipe.name!r} mok recipe's run "
            f"{recipe.precision}; use --transformer-impl transformer_engine, or drop "
            f"--fp8-format"
        )
    # The routed experts' precision comes from the mok recipe, Megatron's fp8 flags reach the
    # rest of the model: they must agree, or switching from alltoall would change the experts.
    if config.fp8 and recipe.precision not in FP8_PRECISIONS:
        yield (
            f"fp8={config.fp8!r} (--fp8-format) with the {recipe.name!r} mok recipe would run the "
            f"routed experts in {recipe.precision}; pass --mok-recipe mxfp8 (or fp8_blockwise "
            f"with --fp8-recipe blockwise), or drop --fp8-format"
        )
    # The experts' recipe under alltoall is TE's --fp8-recipe: the mok recipe must be the same.
    same_recipe = {"fp8_blockwise": "blockwise", "mxfp8": "mxfp8"}.get(recipe.precision)
    if config.fp8 and same_recipe is not None and config.fp8_recipe != same_recipe:
        yield (
            f"fp8_recipe={config.fp8_recipe!r} (--fp8-recipe) with the {recipe.name!r} mok recipe, "
            f"whose routed experts run {recipe.precision}: under alltoall Transformer Engine "
            f"would run them with the {config.fp8_recipe!r} recipe; pass --fp8-recipe "
            f"{same_recipe}, or drop --fp8-format"
        )
    if config.fp8 == "hybrid" and recipe.precision in FP8_PRECISIONS:
        yield (
            f"fp8='hybrid' (--fp8-format hybrid) with the {recipe.name!r} mok recipe: Transformer "
            f"Engine would keep the gradients in E5M2, mok quantizes every operand as E4M3; "
            f"pass --fp8-format e4m3"
        )
    if _may_use_kernels(recipe) and recipe.precision not in CUDA_PRECISIONS:
        yield no_cuda_kernels(recipe)


def _activation_problems(config) -> Iterator[str]:
    from megatron.core.fusions.fused_bias_geglu import quick_gelu

    if config.activation_func is quick_gelu:
        yield f"quick_gelu / --quick-geglu is not implemented by mok; {_ALTERNATIVE}"
        return
    if config.activation_func_clamp_value is not None:
        yield (
            "activation_func_clamp_value (--activation-func-clamp-value) is not implemented by "
            f"mok; {_ALTERNATIVE}"
        )
    if config.glu_linear_offset != 0.0:
        yield f"glu_linear_offset (--glu-linear-offset) is not implemented by mok; {_ALTERNATIVE}"
    try:
        name = activation_name(config)
    except MokConfigError as e:
        yield str(e)
        return
    # Megatron's TE activation builds ReLU for a non-gated SiLU (its TEActivationOp maps
    # F.silu without GLU to te.pytorch.ops.ReLU, 0.17-0.19): alltoall would compute ReLU.
    if name == "silu" and config.use_te_activation_func:
        yield (
            "non-gated silu with use_te_activation_func (--use-te-activation-func): Megatron's "
            "Transformer Engine activation computes ReLU for it, mok computes SiLU; leave "
            "--use-te-activation-func off"
        )
    # Megatron's fused GEGLU and TE's GELU use the tanh approximation; mok computes exact GELU.
    if name in ("gelu", "geglu") and (config.bias_activation_fusion
                                      or config.use_te_activation_func):
        yield (
            f"{name} with bias_activation_fusion / use_te_activation_func (--bias-gelu-fusion, "
            "--use-te-activation-func) computes tanh-approximated GELU, mok computes exact GELU; "
            "pass --no-bias-gelu-fusion and leave --use-te-activation-func off"
        )


def _cuda_graph_problems(config, recipe: Recipe) -> Iterator[str]:
    """Megatron's CUDA graphs with mok. mok's fused call is capturable (its schedule is built
    on the GPU, no host sync) once its first call has run eagerly, since that call allocates
    the symmetric workspace (a collective rendezvous). 'local' records the first training
    iteration eagerly and captures after it; 'full_iteration' captures the iteration number
    cuda_graph_warmup_steps."""
    request = _cuda_graph_request(config)
    if request is None:
        return
    impl, modules = request
    if impl == "none":
        return
    if impl == "transformer_engine":
        yield (
            "cuda_graph_impl='transformer_engine' (--cuda-graph-impl, or --external-cuda-graph): "
            "it captures through Transformer Engine's make_graphed_callables, which mok is not "
            "tested with; use --cuda-graph-impl local (the whole layer, or the 'moe_router' "
            "scope)"
        )
        return
    if impl == "local" and "moe" in modules:
        yield (
            "cuda_graph_modules 'moe' (--cuda-graph-modules moe) with --cuda-graph-impl local: "
            "Megatron captures a MoE layer under this scope only with drop-and-pad "
            "(--moe-pad-expert-input-to-capacity), which mok does not implement; mok's fused call "
            "needs no padding to be captured: leave --cuda-graph-modules empty (the whole layer, "
            "MoE included), or use 'moe_router'"
        )
    if impl == "full_iteration" and not hasattr(torch.autograd.graph,
                                                "set_override_stale_capture_stream"):
        yield (
            f"cuda_graph_impl='full_iteration' (--cuda-graph-impl) needs "
            f"torch.autograd.graph.set_override_stale_capture_stream (pytorch/pytorch#180090), "
            f"which torch {torch.__version__} lacks: without it the capture fails (seen on an "
            "H200 with mok: the parameters' AccumulateGrad nodes keep the stream of the eager "
            "warm-up, 'operation would make the legacy stream depend on a capturing blocking "
            "stream'); use --cuda-graph-impl local (the whole layer)"
        )
    if impl == "full_iteration" and config.cuda_graph_warmup_steps < 1:
        yield (
            f"cuda_graph_impl='full_iteration' with cuda_graph_warmup_steps="
            f"{config.cuda_graph_warmup_steps} (--cuda-graph-warmup-steps): the first iteration "
            "would be captured, but mok's first call allocates its symmetric workspace (a "
            "collective rendezvous), which cannot run inside a capture; use "
            "--cuda-graph-warmup-steps 1 or more"
        )
    # 'local' captures the whole layer, the MoE layer included, with no scope or with 'attn'
    # (a TransformerLayer's manager wraps the layer's whole forward); with 'moe_router' /
    # 'moe_preprocess' the fused call runs eagerly between the router and postprocess graphs.
    if impl == "full_iteration" or not modules or "attn" in modules:
        if recipe.backend == "reference":
            yield (
                f"cuda_graph_impl={impl!r} (--cuda-graph-impl) with backend 'reference' (recipe "
                f"{recipe.name!r}): the reference backend exchanges tokens with host-known split "
                "sizes, which a CUDA graph cannot capture; use backend cuda (or auto), or "
                "--cuda-graph-impl none"
            )
        if recipe.kernel.check_inputs:
            yield (
                f"cuda_graph_impl={impl!r} (--cuda-graph-impl) with kernel.check_inputs: true "
                f"(recipe {recipe.name!r}): the check reads the routing on the host before each "
                "call, which a CUDA graph cannot capture; set check_inputs: false"
            )


def _cuda_graph_request(config) -> Optional[tuple[str, set[str]]]:
    """(implementation, names of the cuda_graph_modules; empty: the whole layer) the config
    asks for, whether or not Megatron's __post_init__ has normalized the spellings yet (the
    deprecated enable_cuda_graph, external_cuda_graph, cuda_graph_scope and 'full_iteration'
    scope). None for values Megatron itself refuses; its own checks then report them."""
    from megatron.core.transformer import enums

    impl = config.cuda_graph_impl
    if impl == "none" and getattr(config, "enable_cuda_graph", False):
        impl = "local"
    if impl == "none" and getattr(config, "external_cuda_graph", False):
        impl = "transformer_engine"
    modules = getattr(config, "cuda_graph_scope", None)
    if modules is None:
        modules = config.cuda_graph_modules
    old_scope = getattr(enums, "CudaGraphScope", ())
    if isinstance(modules, list):
        modules = [m.name if isinstance(m, old_scope) else m for m in modules]
    elif isinstance(modules, old_scope):
        modules = modules.name
    if importlib.util.find_spec("megatron.core.transformer.cuda_graph_config") is None:
        return _scope_request(impl, modules)  # megatron-core < 0.18
    from megatron.core.transformer.cuda_graph_config import normalize_cuda_graph_modules

    try:
        normalized, deprecated, _ = normalize_cuda_graph_modules(modules)
    except (AssertionError, KeyError):
        return None
    if any(name == "full_iteration" for name, _, _ in deprecated):
        impl = "full_iteration"
    return impl, {m.name for m in normalized}


def _scope_request(impl: str, scope) -> tuple[str, set[str]]:
    """megatron-core 0.17's cuda_graph_scope (names, a comma-separated string; 'full' or none
    is the whole layer) as _cuda_graph_request's answer; its 'full_iteration' scope is what
    later versions call cuda_graph_impl='full_iteration'."""
    names = scope.split(",") if isinstance(scope, str) else list(scope or [])
    names = {n for n in names if n and n != "full"}
    if "full_iteration" in names:
        return "full_iteration", names - {"full_iteration"}
    return impl, names


def check_hybridep_available(config) -> None:
    """``flex`` + HybridEP needs ``deep_ep.HybridEPBuffer``: say how to get it before Megatron
    builds a model, rather than at the first MoE layer."""
    backend = (config.moe_token_dispatcher_type, config.moe_flex_dispatcher_backend)
    if backend != ("flex", "hybridep"):
        return
    try:
        found = hasattr(importlib.import_module("deep_ep"), "HybridEPBuffer")
    except ImportError:
        found = False
    if not found:
        raise MokConfigError(
            "--moe-flex-dispatcher-backend hybridep needs deep_ep.HybridEPBuffer, which is not "
            f"importable: {_HYBRIDEP_INSTALL}; or use --moe-token-dispatcher-type alltoall"
        )


def _may_use_kernels(recipe: Recipe) -> bool:
    """Whether this run may take the CUDA path (the reference backend runs anywhere)."""
    return recipe.backend == "cuda" or (recipe.backend == "auto" and torch.cuda.is_available())


def _gpus_per_node() -> Optional[int]:
    # torchrun (and torch.distributed.launch) set LOCAL_WORLD_SIZE; without it the EP group's
    # hosts are checked when the first MoE layer is built (check_ep_group_in_one_node).
    value = os.environ.get("LOCAL_WORLD_SIZE")
    return int(value) if value else None


_CHECKED_GROUPS: set[int] = set()


def check_ep_group_in_one_node(ep_group, recipe: Recipe) -> None:
    """Refuse an EP group whose ranks run on more than one host (CUDA path only). Runs one
    all-gather of host names per EP group, when its first MoE layer is built."""
    if ep_group is None or dist.get_world_size(ep_group) == 1 or not _may_use_kernels(recipe):
        return
    if id(ep_group) in _CHECKED_GROUPS:
        return
    hosts: list[Optional[str]] = [None] * dist.get_world_size(ep_group)
    dist.all_gather_object(hosts, socket.gethostname(), group=ep_group)
    if len(set(hosts)) > 1:
        raise MokConfigError(
            f"the expert-parallel group spans hosts {sorted(set(hosts))} "
            f"(--expert-model-parallel-size {len(hosts)}): mok's kernels need the EP group inside "
            f"one NVLink domain; use --moe-token-dispatcher-type alltoall or flex across nodes"
        )
    _CHECKED_GROUPS.add(id(ep_group))
