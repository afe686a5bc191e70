"""Configuration: precision recipes, dispatchers and model shapes (configs/*/*.yaml).

Three kinds of YAML file, each mapped onto a frozen dataclass by one generic validator:
  - ``configs/recipes/<name>.yaml`` -> :class:`Recipe` (precision, backend, kernel knobs, and the
    Megatron flags the precision implies for every dispatcher, with and without Transformer
    Engine);
  - ``configs/dispatchers/<name>.yaml`` -> :class:`DispatcherConfig` (what the dispatcher turns
    into on a Megatron command line, and what it needs installed);
  - ``configs/models/<name>.yaml`` -> :class:`ModelConfig` (layer shapes and benchmark sizes).

``load_recipe``, ``load_dispatcher`` and ``load_model`` take a bare name or a path to a YAML file.
Bare names resolve under the repository's ``configs/`` folder, which sits next to the package
rather than inside it: use a source checkout with an editable install (``pip install -e .``), or
pass file paths. A config's ``name`` is the file's stem for files under ``configs/`` and the
absolute path otherwise, so the loader always accepts ``obj.name`` again (the Megatron adapter
relies on that for ``--mok-recipe``).

Every problem in a file raises :class:`ConfigError` naming the file and the dotted key, e.g.
``configs/recipes/bf16.yaml: kernel.comm_sms_forward: expected int, got str 'x'``. In a file,
keys whose dataclass field has a default may be left out; the others are required.

Command line: ``python -m mok_megatron.config --recipe bf16 --dispatcher mok --model tiny``
prints the Megatron arguments those resolve to on this machine (and on stderr which of the
recipe's flag sets it took: with or without Transformer Engine); ``--list`` lists the available
configs.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import importlib.util
import re
import shlex
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import (Any, Callable, Iterator, Literal, NewType, Optional, Sequence, TypeVar,
                    Union, get_args, get_origin, get_type_hints)

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
Kind = Literal["recipes", "dispatchers", "models"]
KINDS: tuple[Kind, ...] = ("recipes", "dispatchers", "models")

# Megatron flags, rendered ("--bf16", "--fp8-format", "e4m3", ...). In YAML they are written as a
# mapping `flag-name: value` without dashes; `true` stands for a bare flag.
MegatronArgs = NewType("MegatronArgs", tuple[str, ...])

# H100 SXM and H200 have 132 SMs; at least one must be left for the expert GEMMs.
_MAX_COMM_SMS = 131


def _bounded(default: Any, **bounds: float) -> Any:
    """A field with a default and inclusive `min`/`max` or exclusive `gt` bounds, which the
    loader checks (on each element for tuples)."""
    return field(default=default, metadata=bounds)


def _required(**bounds: float) -> Any:
    return field(metadata=bounds)


@dataclass(frozen=True)
class KernelKnobs:
    # Workspace sizing: the most tokens one rank passes to one MoE layer call. The
    # symmetric workspace holds the worst case (every token of every rank routed to one
    # rank), so no routing skew can overflow it.
    max_tokens_per_rank: int = _bounded(16384, min=1)
    # SMs that move tokens (pull-dispatch, push-combine) while the others run GEMMs.
    comm_sms_forward: int = _bounded(16, min=1, max=_MAX_COMM_SMS)
    comm_sms_backward: int = _bounded(16, min=1, max=_MAX_COMM_SMS)
    # Overlap unit of the megakernel: rows (token copies routed here) its pull copies and
    # publishes together; an FC1 tile starts once its 128-row m-block's rows are published.
    minibatch_tokens: int = _bounded(128, min=1)
    # Rows (token copies routed here) per macrobatch of the megakernels' rings, which bound
    # their row buffers (3 macrobatches resident) whatever the routing: forward's pulled rows
    # and activations, backward's pulled x and dY rows, recomputed h and act, dh. Used by
    # either megakernel with backward_inputs: recomputed (otherwise forward keeps every row
    # for backward anyway); rounded up to 128-row m-blocks. A launch walks at most 256
    # macrobatches of the schedule's worst case (EP · max_tokens_per_rank · topk rows).
    macrobatch_tokens: int = _bounded(16384, min=1)
    # Rows a rank's schedule and forward buffers hold, as a fraction of the worst case (every
    # slot of every rank routed to this rank: EP · max_tokens_per_rank · topk rows). 1.0 can
    # never overflow; less saves memory (with backward_inputs: saved the kept rows and h are
    # sized by it) and a routing that needs more stops with an error naming the rows it
    # needed - no token is ever dropped.
    schedule_capacity: float = _bounded(1.0, gt=0.0, max=1.0)
    # Forward kernels: "separate" (v1: row movers, torch grouped GEMMs, epilogue kernels),
    # "megakernel" (one persistent launch; comm_sms_forward blocks pull rows; every precision,
    # mxfp8 and fp8_blockwise with backward_inputs: recomputed), or "auto" (resolve_kernels:
    # the faster one by the committed measurements). Both give the same bits.
    forward_kernel: Literal["auto", "separate", "megakernel"] = "auto"
    # Backward kernels: "separate" (v1), "megakernel" (one persistent launch: dgrad with
    # the activation backward, dX and dprob pushes and both weight gradients;
    # comm_sms_backward blocks pull dY rows, and x rows with backward_inputs: recomputed, which
    # it reruns FC1 on inside the launch; with backward_inputs: saved it also keeps forward's
    # act, F more bf16 per row; every precision, the FP8 ones with backward_inputs: recomputed
    # and under mxfp8 the weights rounded), or "auto" (resolve_kernels).
    backward_kernel: Literal["auto", "separate", "megakernel"] = "auto"
    # What backward starts from. "recomputed" (the default: what a many-layer model can hold):
    # forward keeps only the schedule (8 bytes per row); backward pulls the token rows again
    # and recomputes h (one more row pull and FC1 per backward, bit-identical gradients).
    # "saved": forward keeps the pulled token rows and FC1's output h, sized for the worst
    # case (EP · max_tokens_per_rank · topk rows of H and of 2F or F, per MoE layer, until
    # its backward) - for few-layer models that have the memory.
    backward_inputs: Literal["saved", "recomputed"] = "recomputed"
    # With backward_inputs: recomputed, forward also keeps h for the schedule's first
    # kept_h_tokens rows (token copies routed here; rounded up to 128-row m-blocks), F1 bf16
    # per row until the layer's backward, and backward recomputes FC1 only past them: a memory
    # bound that no routing moves, traded for FC1's FLOPs (recomputing all of FC1 adds 4/18 of
    # a layer's). 0 keeps none. Read by the separate backward (what auto picks).
    kept_h_tokens: int = _bounded(0, min=0)
    # Every bounded wait - on a peer in the barrier, on another block inside the megakernel or
    # the GEMM engine - stops the kernel after this long with a report naming rank, role and
    # stage (stall_watch.py). It must outlast the largest healthy skew between ranks reaching
    # one barrier (docs/gpu-v1.md gives the measured first-call cost) and still end a dead or
    # stalled rank's run within a minute.
    spin_timeout_ms: int = _bounded(30000, min=1)
    # Validate expert ids / probs values on the host before each call (synchronizes).
    check_inputs: bool = False
    # precision mxfp8: how the expert weights' MXFP8 values are kept between optimizer steps
    # (both orientations, quantized once per step; the products are the same either way).
    # "codes": E4M3 codes + E8M0 scales, 1 byte per weight, dequantized to bf16 per GEMM tile
    # in shared memory. "rounded": the MXFP8 values as bf16, 2 bytes per weight, multiplied by
    # the same tile engine as plain bf16 weights (no per-tile conversion). "auto": rounded
    # where a call's average rows per local expert (tokens x topk / local experts, known from
    # shapes) reach MXFP8_ROUNDED_MIN_ROWS, codes below; rounded wherever backward_kernel is
    # megakernel (it reads no codes).
    mxfp8_weights: Literal["auto", "codes", "rounded"] = "auto"


# kernel.mxfp8_weights: auto keeps a layer's MXFP8 weights rounded to bf16 from this many
# average rows per local expert up, as codes below: the per-tile conversion costs more than
# the weight bytes it saves once a weight tile is reused by this many rows (docs/perf-log.md,
# MXFP8, 2026-12-04: at 128 rows rounded ran 6-30% faster on both forward kernels, at 64 codes 2%).
MXFP8_ROUNDED_MIN_ROWS = 128

# Precisions whose expert GEMMs read FP8 operands (mxfp8.py, fp8_blockwise.py).
FP8_PRECISIONS = ("mxfp8", "fp8_blockwise")
# Precisions the cuda backend has kernels for; the others run on the reference backend only.
CUDA_PRECISIONS = ("bf16", "mxfp8", "fp8_blockwise")


@dataclass(frozen=True)
class Recipe:
    # What load_recipe accepts to load it again: the file's stem or its absolute path.
    name: str = "bf16"
    precision: Literal["bf16", "mxfp8", "fp8_blockwise"] = "bf16"
    backend: Literal["auto", "cuda", "reference"] = "auto"
    kernel: KernelKnobs = field(default_factory=KernelKnobs)
    # Flags the precision implies for every dispatcher (e.g. --bf16).
    megatron_args: MegatronArgs = MegatronArgs(())
    # The flags instead of megatron_args where Transformer Engine is installed, for a precision
    # the rest of the model can follow only through TE (None: megatron_args either way).
    megatron_args_with_te: Optional[MegatronArgs] = None


@dataclass(frozen=True)
class DispatcherConfig:
    name: str
    description: str
    # Must set moe-token-dispatcher-type.
    megatron_args: MegatronArgs
    # Flag that carries the recipe's name to the adapter (mok only).
    recipe_flag: Optional[str] = None
    # "module.Attribute" that must import for this dispatcher to run, and how to install it.
    requires: Optional[str] = None
    install_hint: Optional[str] = None

    def args_for(self, recipe: Recipe) -> list[str]:
        args = list(self.megatron_args)
        if self.recipe_flag is not None:
            args += [f"--{self.recipe_flag}", recipe.name]
        return args

    def check_available(self) -> None:
        """Raise ImportError, with the install hint, if `requires` cannot be imported."""
        if self.requires is None:
            return
        module, _, attr = self.requires.rpartition(".")
        try:
            found = hasattr(importlib.import_module(module), attr)
        except ImportError:
            found = False
        if not found:
            raise ImportError(
                f"dispatcher {self.name!r} needs {self.requires}: {self.install_hint}")


@dataclass(frozen=True)
class BenchSpec:
    # Tokens per GPU to benchmark each shape at.
    tokens_per_gpu: tuple[int, ...] = _required(min=1)
    # Experts per GPU of the "EP64-equivalent" variant (same H, F, top-k and tokens per GPU).
    ep64_experts_per_gpu: int = _required(min=1)


_ACTIVATION_FLAGS: dict[str, list[str]] = {
    "swiglu": ["--swiglu"],
    "squared_relu": ["--squared-relu"],
    "gelu": [],  # Megatron's default activation
}


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden_size: int = _required(min=1)
    moe_ffn_hidden_size: int = _required(min=1)
    num_experts: int = _required(min=1)
    topk: int = _required(min=1)
    shared_expert_intermediate_size: Optional[int] = _required(min=1)
    activation: Literal["swiglu", "squared_relu", "gelu"] = _required()
    num_layers: int = _required(min=1)
    num_attention_heads: int = _required(min=1)
    ffn_hidden_size: int = _required(min=1)
    seq_length: int = _required(min=1)
    max_position_embeddings: int = _required(min=1)
    bench: BenchSpec = _required()

    def megatron_args(self) -> list[str]:
        sizes = {
            "num-layers": self.num_layers,
            "hidden-size": self.hidden_size,
            "ffn-hidden-size": self.ffn_hidden_size,
            "num-attention-heads": self.num_attention_heads,
            "seq-length": self.seq_length,
            "max-position-embeddings": self.max_position_embeddings,
            "num-experts": self.num_experts,
            "moe-ffn-hidden-size": self.moe_ffn_hidden_size,
            "moe-router-topk": self.topk,
            "moe-shared-expert-intermediate-size": self.shared_expert_intermediate_size,
        }
        args = [a for k, v in sizes.items() if v is not None for a in (f"--{k}", str(v))]
        # The megakernel's expert GEMMs have no bias; every dispatcher must build the same
        # parameters so that one checkpoint serves them all.
        return args + _ACTIVATION_FLAGS[self.activation] + ["--disable-bias-linear"]

    def ep64_equivalent(self, ep_size: int) -> ModelConfig:
        """The same layer with only `bench.ep64_experts_per_gpu` experts on each of `ep_size`
        GPUs: what one GPU of an EP=64 deployment computes, at this EP size."""
        num_experts = self.bench.ep64_experts_per_gpu * ep_size
        if ep_size < 1 or self.topk > num_experts:
            raise ValueError(f"model {self.name!r}: no EP64-equivalent at ep_size={ep_size} "
                             f"(top-{self.topk} of {num_experts} experts)")
        return dataclasses.replace(self, name=f"{self.name}-ep64eq", num_experts=num_experts)


class ConfigError(ValueError):
    """A config is invalid; for a file the message names the file and the dotted key."""


class _Invalid(Exception):
    """A problem at a dotted key, before the file name is known."""

    def __init__(self, key: str, problem: str):
        super().__init__(key, problem)
        self.key, self.problem = key, problem


def _show(value: object) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"


def _join(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


_FLAG_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def _render_flags(value: object, key: str) -> MegatronArgs:
    if not isinstance(value, dict):
        raise _Invalid(key, f"expected a mapping of flag: value, got {_show(value)}")
    args: list[str] = []
    for flag, v in value.items():
        at = _join(key, flag)
        if not isinstance(flag, str) or not _FLAG_NAME.fullmatch(flag):
            raise _Invalid(at, "a flag name is lower-case words joined by '-', without dashes "
                               "in front")
        # `false` has no meaning on a command line: leave the flag out instead.
        if v is True:
            args.append(f"--{flag}")
        elif isinstance(v, (str, int, float)) and not isinstance(v, bool):
            args += [f"--{flag}", str(v)]
        else:
            raise _Invalid(at, f"expected true (a bare flag) or a str/int/float value, "
                               f"got {_show(v)}")
    return MegatronArgs(tuple(args))


def _convert(tp: Any, value: object, key: str) -> Any:
    """Check `value` (parsed YAML) against the field type `tp` and convert it."""
    if tp is MegatronArgs:
        return _render_flags(value, key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        if isinstance(value, str) and value in args:
            return value
        raise _Invalid(key, f"expected one of {', '.join(map(repr, args))}, got {_show(value)}")
    if origin in (Union, types.UnionType):  # only Optional[X] is used
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, key)
    if origin is tuple:
        if not isinstance(value, list):
            raise _Invalid(key, f"expected a list, got {_show(value)}")
        return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is float and type(value) is int:
        return float(value)
    # `type(...) is`, not isinstance: YAML's true/false must not pass for an int.
    if tp in (bool, int, float, str):
        if type(value) is tp:
            return value
        raise _Invalid(key, f"expected {tp.__name__}, got {_show(value)}")
    raise TypeError(f"config field type {tp!r} is not supported by the loader")


def _check_bounds(bounds: dict[str, float], value: Any, key: str) -> None:
    for v in value if isinstance(value, tuple) else (value,):
        if v is None:
            continue
        if "min" in bounds and v < bounds["min"]:
            raise _Invalid(key, f"must be >= {bounds['min']}, got {v}")
        if "max" in bounds and v > bounds["max"]:
            raise _Invalid(key, f"must be <= {bounds['max']}, got {v}")
        if "gt" in bounds and v <= bounds["gt"]:
            raise _Invalid(key, f"must be > {bounds['gt']}, got {v}")


# Checks that span several fields: (key relative to the object, problem) for each violation.
# Knobs only some settings read: (name, whether recipe k reads it, who does). A recipe may
# move one from its default only where it is read, so nobody tunes a setting that changes
# nothing.
_CONDITIONAL_KNOBS = (
    ("comm_sms_backward", lambda k: k.backward_kernel != "separate",
     "only backward_kernel: megakernel (or auto) reads it"),
    ("minibatch_tokens",
     lambda k: k.forward_kernel != "separate" or k.backward_kernel != "separate",
     "only the megakernels read it"),
    ("macrobatch_tokens",
     lambda k: ((k.forward_kernel, k.backward_kernel) != ("separate", "separate")
                and k.backward_inputs == "recomputed"),
     "only a megakernel with backward_inputs: recomputed reads it"),
)


def _kernel_problems(k: KernelKnobs) -> Iterator[tuple[str, str]]:
    if k.minibatch_tokens > k.macrobatch_tokens:
        yield ("minibatch_tokens", f"must be <= macrobatch_tokens ({k.macrobatch_tokens}), "
                                   f"got {k.minibatch_tokens}")
        return
    for name, reads, who in _CONDITIONAL_KNOBS:
        default = KernelKnobs.__dataclass_fields__[name].default
        if getattr(k, name) != default and not reads(k):
            yield (name, f"{who}: leave it at {default}")


def _dispatcher_problems(d: DispatcherConfig) -> Iterator[tuple[str, str]]:
    if "--moe-token-dispatcher-type" not in d.megatron_args:
        yield "megatron_args", "must set moe-token-dispatcher-type"
    if d.recipe_flag is not None and not _FLAG_NAME.fullmatch(d.recipe_flag):
        yield "recipe_flag", f"not a flag name (no leading dashes): {d.recipe_flag!r}"
    if d.requires is not None and "." not in d.requires:
        yield "requires", f"expected 'module.Attribute', got {d.requires!r}"
    if (d.requires is None) != (d.install_hint is None):
        yield "install_hint", "requires and install_hint go together"


def _bench_problems(b: BenchSpec) -> Iterator[tuple[str, str]]:
    if not b.tokens_per_gpu:
        yield "tokens_per_gpu", "must not be empty"


def _model_problems(m: ModelConfig) -> Iterator[tuple[str, str]]:
    if m.topk > m.num_experts:
        yield "topk", f"must be <= num_experts ({m.num_experts}), got {m.topk}"
    if m.hidden_size % m.num_attention_heads:
        yield ("num_attention_heads", f"must divide hidden_size ({m.hidden_size}), "
                                      f"got {m.num_attention_heads}")
    if m.seq_length > m.max_position_embeddings:
        yield ("seq_length", f"must be <= max_position_embeddings "
                             f"({m.max_position_embeddings}), got {m.seq_length}")
    if m.bench.ep64_experts_per_gpu > m.num_experts:
        yield ("bench.ep64_experts_per_gpu", f"must be <= num_experts ({m.num_experts}), "
                                             f"got {m.bench.ep64_experts_per_gpu}")


def resolve_kernels(r: Recipe, world: int) -> Recipe:
    """The recipe with its "auto" kernels replaced by the path measured faster (both give the
    same bits, so the choice is speed alone). The rule, from the committed measurements
    (docs/perf-log.md; the README's table):
      - at EP > 1, the separate kernels: the megakernels have not run on several GPUs yet;
      - forward: the megakernel at EP = 1 (faster than the separate forward on the measured
        shapes under every recipe), where the recipe allows it (an FP8 recipe's needs
        backward_inputs: recomputed);
      - backward: the separate kernels (the backward megakernel is slower on every measured
        shape).
    Explicit choices stay as they are."""
    k = r.kernel
    if "auto" not in (k.forward_kernel, k.backward_kernel):
        return r
    fp8_saved = r.precision in FP8_PRECISIONS and k.backward_inputs != "recomputed"
    forward = "megakernel" if world == 1 and not fp8_saved else "separate"
    return dataclasses.replace(r, kernel=dataclasses.replace(
        k, forward_kernel=forward if k.forward_kernel == "auto" else k.forward_kernel,
        backward_kernel="separate" if k.backward_kernel == "auto" else k.backward_kernel))


def recipe_problems(r: Recipe) -> Iterator[tuple[str, str]]:
    """What a recipe's precision and kernel knobs need of each other (also checked at a cuda
    call, after resolve_kernels)."""
    if r.precision != "mxfp8" and r.kernel.mxfp8_weights != "auto":
        yield ("kernel.mxfp8_weights", f"only precision mxfp8 reads it (this recipe's is "
                                       f"{r.precision}): leave it at auto")
    if r.kernel.kept_h_tokens:
        if r.kernel.backward_inputs != "recomputed":
            yield ("kernel.kept_h_tokens", "only backward_inputs: recomputed reads it (saved "
                                           "inputs keep every row's h): leave it at 0")
        elif r.kernel.backward_kernel == "megakernel":
            yield ("kernel.kept_h_tokens", "the backward megakernel recomputes every macrobatch "
                                           "of its ring; only the separate backward reads kept "
                                           "h: set backward_kernel to separate or auto, or "
                                           "leave it at 0")
    if r.precision in FP8_PRECISIONS and r.kernel.backward_kernel == "megakernel":
        if r.kernel.backward_inputs != "recomputed":
            yield ("kernel.backward_inputs", f"the backward megakernel under {r.precision} "
                                             f"rounds the rows it pulls in place, which "
                                             f"forward's saved rows must outlive: set it to "
                                             f"recomputed")
        if r.precision == "mxfp8" and r.kernel.mxfp8_weights == "codes":
            yield ("kernel.mxfp8_weights", "the backward megakernel under mxfp8 reads the weights "
                                           "as bf16 MXFP8 values (its dgrads have no per-stage "
                                           "code conversion yet): set it to rounded or auto")
    if (r.precision in ("mxfp8", "fp8_blockwise") and r.kernel.forward_kernel == "megakernel"
            and r.kernel.backward_inputs != "recomputed"):
        yield ("kernel.backward_inputs", f"the forward megakernel under {r.precision} pulls x "
                                         f"rows quantized along H already, which backward's "
                                         f"weight gradient cannot start from (it quantizes x "
                                         f"along the expert's rows): set it to recomputed")


def no_cuda_kernels(r: Recipe) -> str:
    """Why the cuda backend cannot run recipe r (its precision not in CUDA_PRECISIONS)."""
    return (f"recipe {r.name!r}: precision {r.precision} has no CUDA kernels yet; run it on the "
            f"PyTorch reference with backend: reference in the recipe (any device)")


_PROBLEMS: dict[type, Callable[[Any], Iterator[tuple[str, str]]]] = {
    Recipe: recipe_problems,
    KernelKnobs: _kernel_problems,
    DispatcherConfig: _dispatcher_problems,
    BenchSpec: _bench_problems,
    ModelConfig: _model_problems,
}

T = TypeVar("T")


def _build(cls: type[T], data: object, key: str, derived: Optional[dict[str, Any]] = None) -> T:
    """Build dataclass `cls` from a YAML mapping; `derived` fields are set by the loader and
    are not allowed in the file."""
    derived = derived or {}
    if not isinstance(data, dict):
        raise _Invalid(key, f"expected a mapping, got {_show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in derived}
    for k in data:
        if k not in fields:
            close = difflib.get_close_matches(str(k), list(fields), n=1)
            hint = (f"did you mean {close[0]!r}?" if close
                    else f"expected one of {', '.join(fields)}")
            raise _Invalid(_join(key, k), f"unknown key ({hint})")
    hints = get_type_hints(cls)
    values = dict(derived)
    for name, f in fields.items():
        at = _join(key, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _Invalid(at, "missing required key")
            continue
        values[name] = _convert(hints[name], data[name], at)
        _check_bounds(dict(f.metadata), values[name], at)
    obj = cls(**values)
    for k, problem in _PROBLEMS.get(cls, lambda _: iter(()))(obj):
        raise _Invalid(_join(key, k), problem)
    return obj


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, which PyYAML would silently overwrite."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    mapping = loader.construct_mapping(node, deep=True)
    seen: set = set()
    for key_node, _ in node.value:
        k = loader.construct_object(key_node, deep=True)
        if k in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {k!r}", key_node.start_mark)
        seen.add(k)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _resolve(kind: Kind, name_or_path: str | Path) -> tuple[Path, str]:
    """The file for a bare name or a path, and the name that loads it again."""
    given = Path(name_or_path).expanduser()
    kind_dir = CONFIG_DIR / kind
    if given.suffix in (".yaml", ".yml") or len(given.parts) > 1:
        path = given.resolve()
    else:
        path = kind_dir / f"{given}.yaml"
        if not path.is_file():
            raise ConfigError(f"{_display(path)}: no such file; available {kind}: "
                              f"{', '.join(list_configs(kind)) or 'none'}")
    if not path.is_file():
        raise ConfigError(f"{_display(path)}: no such file")
    return path, (path.stem if path.parent == kind_dir else str(path))


def _load(kind: Kind, cls: type[T], name_or_path: str | Path) -> T:
    path, name = _resolve(kind, name_or_path)
    shown = _display(path)
    try:
        data = yaml.load(path.read_text(), Loader=_StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{shown}: invalid YAML: {e}") from None
    try:
        return _build(cls, data, "", derived={"name": name})
    except _Invalid as e:
        raise ConfigError(f"{shown}: {e.key}: {e.problem}" if e.key
                          else f"{shown}: {e.problem}") from None


def load_recipe(name_or_path: str | Path) -> Recipe:
    return _load("recipes", Recipe, name_or_path)


def load_dispatcher(name_or_path: str | Path) -> DispatcherConfig:
    return _load("dispatchers", DispatcherConfig, name_or_path)


def load_model(name_or_path: str | Path) -> ModelConfig:
    return _load("models", ModelConfig, name_or_path)


def list_configs(kind: Kind) -> list[str]:
    """Names of the configs of one kind under CONFIG_DIR."""
    return sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))


def transformer_engine_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def recipe_megatron_args(recipe: Recipe, have_te: Optional[bool] = None
                         ) -> tuple[MegatronArgs, str]:
    """The recipe's Megatron flags for a run with Transformer Engine (have_te; None: whether it
    is installed here) or without, and a line saying which set that is."""
    if recipe.megatron_args_with_te is None:
        return recipe.megatron_args, f"recipe {recipe.name!r}: megatron_args"
    if have_te is None:
        have_te = transformer_engine_installed()
    if have_te:
        return (recipe.megatron_args_with_te,
                f"recipe {recipe.name!r}: with Transformer Engine: megatron_args_with_te")
    return (recipe.megatron_args,
            f"recipe {recipe.name!r}: without Transformer Engine: megatron_args")


def resolve_megatron_args(recipe: Recipe, dispatcher: DispatcherConfig,
                          model: ModelConfig, have_te: Optional[bool] = None) -> list[str]:
    """Megatron command-line arguments for a model run through a dispatcher under a recipe,
    with or without Transformer Engine (recipe_megatron_args). A flag set by two of them is
    an error rather than a silent last-one-wins."""
    parts = {f"model {model.name!r}": model.megatron_args(),
             f"recipe {recipe.name!r}": list(recipe_megatron_args(recipe, have_te)[0]),
             f"dispatcher {dispatcher.name!r}": dispatcher.args_for(recipe)}
    owner: dict[str, str] = {}
    for source, args in parts.items():
        for flag in (a for a in args if a.startswith("--")):
            if flag in owner:
                raise ConfigError(f"{flag} is set by both {owner[flag]} and {source}")
            owner[flag] = source
    return [a for args in parts.values() for a in args]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mok_megatron.config",
        description="Print the Megatron arguments a recipe, a dispatcher and a model resolve to.")
    parser.add_argument("--recipe", help="recipe name or YAML path (configs/recipes)")
    parser.add_argument("--dispatcher", help="dispatcher name or YAML path (configs/dispatchers)")
    parser.add_argument("--model", help="model name or YAML path (configs/models)")
    parser.add_argument("--list", action="store_true", help="list the available configs")
    opts = parser.parse_args(argv)
    if opts.list:
        for kind in KINDS:
            print(f"{kind}: {' '.join(list_configs(kind))}")
        return 0
    if not (opts.recipe and opts.dispatcher and opts.model):
        parser.error("--recipe, --dispatcher and --model are required (or --list)")
    try:
        recipe = load_recipe(opts.recipe)
        args = resolve_megatron_args(recipe, load_dispatcher(opts.dispatcher),
                                     load_model(opts.model))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(recipe_megatron_args(recipe)[1], file=sys.stderr)
    print(shlex.join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
