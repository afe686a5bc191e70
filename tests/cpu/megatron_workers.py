"""What each gloo rank runs for the Megatron adapter tests (see megatron_harness.run_distributed).
Workers return plain tensors and dicts; the tests compare them in the pytest process."""

from __future__ import annotations

import inspect
import os

import torch
import torch.distributed as dist

from megatron_harness import CASES, HIDDEN, NUM_EXPERTS, TOKENS, build_moe_layer, layer_tensors

PREFIX = "decoder.layers.0.mlp."


def _forward_backward(layer, x, dy) -> dict:
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    y, bias = layer(x)
    assert bias is None
    y.backward(dy)
    return {
        "y": y.detach(),
        "dx": x.grad,
        "grads": {n: p.grad.clone() for n, p in layer.named_parameters()},
    }


def parity(case_names: list[str]) -> dict:
    """The same MoE layer (same weights, same input and output gradient on each rank) under
    alltoall and under mok (twice, for determinism; and once more spelled as newer Megatron's
    ``moe_megakernel_backend: mok`` on an alltoall config)."""
    results = {}
    for name in case_names:
        overrides = CASES[name]
        alltoall = build_moe_layer("alltoall", seed=1234, **overrides)
        mok = build_moe_layer("mok", seed=4321, **overrides)
        mok.load_state_dict(alltoall.state_dict())  # strict: the same names and shapes
        spelled = build_moe_layer("alltoall", seed=4321, megakernel_backend="mok", **overrides)
        spelled.load_state_dict(alltoall.state_dict())
        dtype = overrides.get("params_dtype", torch.float32)
        generator = torch.Generator().manual_seed(100 + dist.get_rank())
        x = torch.randn(*TOKENS, HIDDEN, generator=generator).to(dtype)
        dy = torch.randn(*TOKENS, HIDDEN, generator=generator).to(dtype)
        results[name] = {
            "alltoall": _forward_backward(alltoall, x, dy),
            "mok": _forward_backward(mok, x, dy),
            "mok_again": _forward_backward(mok, x, dy),
            "megakernel_spelling": _forward_backward(spelled, x, dy),
            "dispatchers": (type(mok.token_dispatcher).__name__,
                            type(spelled.token_dispatcher).__name__),
            "experts": (type(alltoall.experts).__name__, type(mok.experts).__name__),
            "experts_config_dispatcher": mok.experts.config.moe_token_dispatcher_type,
        }
    return results


def _sharded_metadata(layer) -> dict:
    """Everything distributed checkpointing keys on, per entry of the sharded state dict."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    meta = {}
    for name, item in layer.sharded_state_dict(prefix=PREFIX).items():
        if isinstance(item, ShardedTensor):
            meta[name] = (item.key, tuple(item.global_shape), tuple(item.global_offset),
                          tuple(item.axis_fragmentations), item.dtype)
        else:
            meta[name] = (type(item).__name__, getattr(item, "key", None))
    return meta


def _save(layer, directory: str) -> None:
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        os.makedirs(directory)
    dist.barrier()
    dist_checkpointing.save(layer.sharded_state_dict(prefix=PREFIX), directory)


def _load(layer, directory: str) -> None:
    from megatron.core import dist_checkpointing

    loaded = dist_checkpointing.load(layer.sharded_state_dict(prefix=PREFIX), directory)
    layer.load_state_dict({k[len(PREFIX):]: v for k, v in loaded.items()})


def checkpoint_round_trip(root: str) -> dict:
    """alltoall --torch_dist--> mok --torch_dist--> alltoall, each layer built from its own seed
    so that only the checkpoint can make their tensors equal."""
    case = CASES["swiglu_shared_auxloss"]
    original = build_moe_layer("alltoall", seed=1, **case)
    mok = build_moe_layer("mok", seed=2, **case)
    back = build_moe_layer("alltoall", seed=3, **case)
    metadata = {"alltoall": _sharded_metadata(original), "mok": _sharded_metadata(mok)}
    _save(original, os.path.join(root, "from_alltoall"))
    _load(mok, os.path.join(root, "from_alltoall"))
    _save(mok, os.path.join(root, "from_mok"))
    _load(back, os.path.join(root, "from_mok"))
    return {
        "metadata": metadata,
        "original": layer_tensors(original),
        "mok": layer_tensors(mok),
        "back": layer_tensors(back),
    }


def _moe_router_stages(layer, x: torch.Tensor, replay: bool) -> torch.Tensor:
    """The MLP half of a MoETransformerLayer the way Megatron's 'moe_router' CUDA graphs run
    it: the router stage (pre-MLP norm, router, dispatch_preprocess), the experts eagerly,
    then the postprocess stage. A replay runs the router stage's kernels but not its Python,
    so the dispatcher keeps the attributes it had before; only what the stage returns (the
    dispatcher's ``cudagraph_attrs`` among them) reaches the experts."""
    dispatcher = layer.mlp.token_dispatcher
    before = dict(vars(dispatcher))
    residual, hidden, probs, shared, *attrs = layer._forward_mlp_router(x)
    if replay:
        vars(dispatcher).clear()
        vars(dispatcher).update(before)
    # megatron-core 0.19 passes the router stage's dispatcher attributes on; 0.18 restores them
    # from the layer's own cache (token_dispatcher_attrs), which the router stage fills.
    if len(inspect.signature(layer._forward_mlp_expert_compute).parameters) == 3:
        output, bias = layer._forward_mlp_expert_compute(hidden, probs, attrs)
    else:
        output, bias = layer._forward_mlp_expert_compute(hidden, probs)
    return layer._forward_mlp_postprocess(residual, output, shared, bias)


def moe_router_graph_stages() -> dict:
    """A MoETransformerLayer (local spec, mok, reference backend) run through Megatron's own
    partial-graph stage functions with replay semantics, against the same layer run eagerly:
    output, input gradient and parameter gradients."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_submodules
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.transformer_layer import MoETransformerLayer

    from megatron_harness import NUM_EXPERTS, base_config

    config = base_config("mok", dist.get_world_size(), hidden_dropout=0.0,
                         attention_dropout=0.0, bias_dropout_fusion=False,
                         moe_shared_expert_intermediate_size=8)
    spec = ModuleSpec(module=MoETransformerLayer, submodules=get_gpt_layer_local_submodules(
        num_experts=NUM_EXPERTS, moe_grouped_gemm=False))
    torch.manual_seed(5)
    staged = build_module(spec, config=config, layer_number=1)
    eager = build_module(spec, config=config, layer_number=1)
    eager.load_state_dict(staged.state_dict())
    # What transition_cudagraph_scope('partial') sets; its graph managers need CUDA.
    staged.use_partial_cudagraphs = True

    generator = torch.Generator().manual_seed(7)
    x_capture, x, dy = (torch.randn(*TOKENS, HIDDEN, generator=generator) for _ in range(3))
    # Record, warm-up and capture run the stages' Python once before any replay.
    _moe_router_stages(staged, x_capture, replay=False)
    results = {}
    for name, run in (("replayed", lambda t: _moe_router_stages(staged, t, replay=True)),
                      ("eager", eager._forward_mlp)):
        layer = staged if name == "replayed" else eager
        layer.zero_grad(set_to_none=True)
        inp = x.clone().requires_grad_(True)
        out = run(inp)
        out.backward(dy)
        results[name] = {
            "y": out.detach(),
            "dx": inp.grad,
            "grads": {n: p.grad.clone() for n, p in layer.named_parameters()
                      if p.grad is not None},
        }
    results["cudagraph_attrs"] = list(staged.mlp.token_dispatcher.cudagraph_attrs)
    return results


def selected_through_use_mok(kinds: list[str], recipe: str) -> dict:
    """For each kind of config (bridge_configs.KINDS): one that becomes mok through
    ``use_mok(config, recipe)`` and is finalized as Bridge does, the MoE layer Megatron builds
    from it, and its output against an alltoall layer with the same weights."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec

    from bridge_configs import finalize, moe_config
    from mok_megatron.megatron.bridge import use_mok
    from mok_megatron.megatron.recipe import active_recipe

    spec = get_moe_module_spec(use_te=False, num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
    ep = dist.get_world_size()
    results = {}
    for kind in kinds:
        config = moe_config(kind, expert_model_parallel_size=ep)
        use_mok(config, recipe=recipe)
        finalize(config)
        mok = spec(config=config)
        alltoall = spec(config=moe_config("core", expert_model_parallel_size=ep))
        alltoall.load_state_dict(mok.state_dict())
        x = torch.randn(*TOKENS, HIDDEN, generator=torch.Generator().manual_seed(dist.get_rank()))
        results[kind] = {
            "dispatcher": type(mok.token_dispatcher).__name__,
            "layer_recipe": mok.token_dispatcher.recipe.name,
            "active_recipe": active_recipe().name,
            "mok": mok(x)[0].detach(),
            "alltoall": alltoall(x)[0].detach(),
        }
    return results


class StandInLoRALinear(torch.nn.Module):
    """Megatron-Bridge's ``LoRALinear`` as the mok adapter sees it (megatron/bridge/peft/
    adapter_wrapper.py and lora_layers.py): the base linear kept as ``to_wrap``, a low-rank
    ``adapter`` with ``linear_in`` / ``linear_out``, a ``weight`` property merging the two, and a
    forward adding the adapter's output. Bridge itself cannot be imported here: its package
    imports transformers, its lora_layers Transformer Engine."""

    def __init__(self, to_wrap: torch.nn.Module, rank: int = 2) -> None:
        super().__init__()
        self.to_wrap = to_wrap
        out_features, in_features = to_wrap.weight.shape
        self.adapter = torch.nn.Module()
        self.adapter.linear_in = torch.nn.Linear(in_features, rank, bias=False)
        self.adapter.linear_out = torch.nn.Linear(rank, out_features, bias=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.to_wrap.weight + self.adapter.linear_out.weight @ self.adapter.linear_in.weight

    def forward(self, x, *args, **kwargs):
        out, bias = self.to_wrap(x, *args, **kwargs)
        return out + self.adapter.linear_out(self.adapter.linear_in(x)), bias


class WeightOnlyByProperty(torch.nn.Module):
    """A wrapper with no ``to_wrap`` whose ``weight`` is not a Parameter of its own."""

    def __init__(self, base: torch.nn.Module) -> None:
        super().__init__()
        self.base = base

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, x, *args, **kwargs):
        return self.base(x, *args, **kwargs)


def _mok_error(layer, x) -> str | None:
    """The MokConfigError message of one forward + backward, None if it succeeds."""
    from mok_megatron.megatron.validation import MokConfigError

    try:
        y, _ = layer(x)
        y.sum().backward()
    except MokConfigError as e:
        return str(e)
    return None


def _zero_weight_hook(calls: list, name: str):
    """A pre-hook that zeroes its module's weight in place, as DDP's all-gather overwrites it."""

    def hook(module, args, kwargs=None):
        calls.append(name)
        with torch.no_grad():
            module.weight.zero_()

    return hook


def expert_hooks() -> dict:
    """How the mok experts step treats the hooks of the experts' modules, and expert linears
    wrapped after the model is built (as PEFT does). EP=1: all experts are local."""
    import megatron.core.utils as megatron_utils

    from mok_megatron.megatron import dispatcher

    generator = torch.Generator().manual_seed(7)
    x = torch.randn(*TOKENS, HIDDEN, generator=generator)
    out = {}

    # Forward pre-hooks run once each before the fused call reads the weights: zeroing every
    # FC2 in them must zero the routed experts' output (the layer has no shared expert).
    layer = build_moe_layer("mok", seed=5)
    calls = []
    handles = []
    for i, expert in enumerate(layer.experts.local_experts):
        with_kwargs = i % 2 == 1
        hook = _zero_weight_hook(calls, f"local_experts.{i}.linear_fc2")
        handles.append(expert.linear_fc2.register_forward_pre_hook(hook, with_kwargs=with_kwargs))
    y, _ = layer(x)
    out["zeroing_pre_hooks"] = {"y": y.detach(), "calls": list(calls)}
    for handle in handles:
        handle.remove()

    def returns_input(module, args):
        return args

    layer = build_moe_layer("mok", seed=5)
    handle = layer.experts.local_experts[0].linear_fc1.register_forward_pre_hook(returns_input)
    out["pre_hook_returning_input"] = _mok_error(layer, x)
    handle.remove()
    out["after_removing_it"] = _mok_error(layer, x)

    def post_hook(module, args, output):
        pass

    def backward_hook(module, grad_input, grad_output):
        pass

    def backward_pre_hook(module, grad_output):
        pass

    refused = {}
    registrations = {
        "forward hook": lambda e: e.local_experts[1].linear_fc2.register_forward_hook(post_hook),
        "backward hook": lambda e: e.register_full_backward_hook(backward_hook),
        "backward pre-hook":
            lambda e: e.local_experts[0].register_full_backward_pre_hook(backward_pre_hook),
    }
    for kind, register in registrations.items():
        layer = build_moe_layer("mok", seed=5)
        handle = register(layer.experts)
        refused[kind] = _mok_error(layer, x)
        handle.remove()
        refused[f"{kind}, removed"] = _mok_error(layer, x)
    out["refused_hooks"] = refused

    wrapped = {}
    for wrapper in (StandInLoRALinear, WeightOnlyByProperty):
        layer = build_moe_layer("mok", seed=5)
        expert = layer.experts.local_experts[0]
        expert.linear_fc1 = wrapper(expert.linear_fc1)
        wrapped[wrapper.__name__] = _mok_error(layer, x)
    out["wrapped_linears"] = wrapped

    # The structure check runs at the first forward of a layer only.
    check = getattr(dispatcher, "check_expert_linears", None)
    if check is not None:
        checks = []
        dispatcher.check_expert_linears = lambda experts: checks.append(1) or check(experts)
        try:
            layer = build_moe_layer("mok", seed=5)
            for _ in range(3):
                layer(x)
        finally:
            dispatcher.check_expert_linears = check
    out["structure_checks_in_three_forwards"] = None if check is None else len(checks)

    # Newer Megatron's ensure_params_ready, where it exists, gets the Parameters the fused call
    # reads, after the pre-hooks.
    layer = build_moe_layer("mok", seed=5)
    events = []
    layer.experts.local_experts[0].linear_fc1.register_forward_pre_hook(
        lambda module, args: events.append("pre-hook"))
    megatron_utils.ensure_params_ready = lambda params: events.append([id(p) for p in params])
    try:
        layer(x)
    finally:
        del megatron_utils.ensure_params_ready
    w1, w2 = dispatcher.expert_weights(layer.experts)
    out["ensure_params_ready"] = {"events": events, "expert_params": [id(p) for p in w1 + w2]}

    # Frozen experts, as PEFT leaves them when it adapts other modules only.
    alltoall = build_moe_layer("alltoall", seed=5)
    mok = build_moe_layer("mok", seed=6)
    mok.load_state_dict(alltoall.state_dict())
    frozen = {}
    for name, layer in (("alltoall", alltoall), ("mok", mok)):
        layer.experts.requires_grad_(False)
        inputs = x.clone().requires_grad_(True)
        y, _ = layer(inputs)
        y.backward(torch.ones_like(y))
        frozen[name] = {"y": y.detach(), "dx": inputs.grad,
                        "expert_grads": [p.grad for p in layer.experts.parameters()]}
    out["frozen_experts"] = frozen
    return out


def first_last_bf16_layers() -> dict:
    """One mok MoE layer of a 4-layer model with --first-last-layers-bf16 (one BF16 layer at
    each end) as each of its layer numbers, under the bf16 and the fp8_blockwise mok recipe
    (reference backend, the same weights): {(recipe, layer number): y}."""
    from mok_megatron.megatron.recipe import set_recipe

    x = torch.randn(*TOKENS, HIDDEN, generator=torch.Generator().manual_seed(3))
    outs = {}
    for recipe in ("bf16", "fp8_blockwise"):
        set_recipe(recipe)
        layer = build_moe_layer("mok", seed=5, num_layers=4, first_last_layers_bf16=True,
                                num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=1)
        for number in range(1, 5):
            layer.set_layer_number(number)
            outs[(recipe, number)] = layer(x)[0].detach()
    set_recipe(None)
    return outs
