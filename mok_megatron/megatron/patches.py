"""Extend Megatron in place so that ``--moe-token-dispatcher-type mok`` exists.

Three patches, one per Megatron module, each idempotent (a marker on the patched function) and
each changing behaviour only for configs that select ``mok``:
  - ``patch_transformer_config``: add ``mok`` to the ``Literal`` type of
    ``TransformerConfig.moe_token_dispatcher_type`` (Megatron's argparse takes its choices from
    it), and check a config against the support matrix as Megatron's ``__post_init__`` ends
    (or as it fails);
  - ``patch_moe_layer``: ``MoELayer`` builds a ``MokTokenDispatcher`` and runs its routed experts
    through it. MoELayer is extended rather than subclassed because Megatron tests its exact
    class in places;
  - ``patch_arguments``: add ``--mok-recipe`` to Megatron's argument parser.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import typing

from .validation import MOK, check_config, check_hybridep_available, uses_mok

_MARKER = "__mok_megatron_patch__"


def _is_patched(func) -> bool:
    return getattr(func, _MARKER, False)


def _mark(func):
    setattr(func, _MARKER, True)
    return func


def patch_transformer_config() -> None:
    from megatron.core.transformer.transformer_config import TransformerConfig

    # Subclasses (MLATransformerConfig, ...) share these Field objects.
    field = TransformerConfig.__dataclass_fields__["moe_token_dispatcher_type"]
    choices = typing.get_args(field.type)
    if MOK not in choices:
        field.type = typing.Literal[(*choices, MOK)]
        TransformerConfig.__annotations__[field.name] = field.type

    post_init = TransformerConfig.__post_init__
    if _is_patched(post_init):
        return

    @functools.wraps(post_init)
    def __post_init__(self):
        from .recipe import active_recipe

        check_hybridep_available(self)
        if not uses_mok(self) or self.num_moe_experts is None:
            post_init(self)
            return
        recipe = active_recipe()
        # The support matrix is checked on the config Megatron's __post_init__ leaves: it turns
        # deprecated spellings into the settings checked here (enable_cuda_graph into
        # cuda_graph_impl, moe_router_padding_for_fp8 into moe_router_padding_for_quantization).
        # Megatron also refuses some settings itself, with messages written for its own
        # dispatchers ("moe_shared_expert_overlap only works with alltoall or flex"): where it
        # raises, the config as far as it got is checked, and the matrix's error, which says
        # what to do with mok, is raised from Megatron's. Each check reads its setting right
        # whether Megatron has normalized it yet or not.
        try:
            post_init(self)
        except Exception as megatron_error:
            check_config(self, recipe, cause=megatron_error)
            raise
        check_config(self, recipe)

    TransformerConfig.__post_init__ = _mark(__post_init__)


def patch_moe_layer() -> None:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    init = MoELayer.__init__
    if _is_patched(init):
        return
    routed_experts_compute = MoELayer.routed_experts_compute
    init_signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, config, *args, **kwargs):
        if not uses_mok(config):
            init(self, config, *args, **kwargs)
            return
        from megatron.core.transformer.moe.moe_utils import get_default_pg_collection

        from .dispatcher import MokTokenDispatcher, expert_weights
        from .recipe import active_recipe
        from .validation import check_ep_group_in_one_node

        # Megatron's __init__ picks its dispatcher from an if-chain that knows no 'mok': let it
        # build the cheapest one (allgather, which allocates nothing), then replace it.
        with _as_megatron_dispatcher(config) as mok_values:
            init(self, config, *args, **kwargs)
        # Copies of the config taken meanwhile (SequentialMLP deep-copies it) say mok too.
        for module in self.modules():
            copy = getattr(module, "config", config)
            if copy is not config and hasattr(copy, "moe_token_dispatcher_type"):
                for name, value in mok_values.items():
                    setattr(copy, name, value)
        bound = init_signature.bind(self, config, *args, **kwargs)
        pg_collection = bound.arguments.get("pg_collection") or get_default_pg_collection()
        recipe = active_recipe()
        check_ep_group_in_one_node(pg_collection.ep, recipe)
        expert_weights(self.experts)  # refuses an experts module mok cannot read, now
        self.token_dispatcher = MokTokenDispatcher(
            self.num_local_experts, config, pg_collection, recipe
        )

    @functools.wraps(routed_experts_compute)
    def mok_routed_experts_compute(self, hidden_states, probs):
        from .dispatcher import MokTokenDispatcher

        if not isinstance(self.token_dispatcher, MokTokenDispatcher):
            return routed_experts_compute(self, hidden_states, probs)
        # A multi-token-prediction layer runs in the model's FP8 whatever its number, as in
        # Megatron (its layers are numbered 1..k outside the decoder's first / last BF16 rule).
        layer_number = None if getattr(self, "is_mtp_layer", False) else self.layer_number
        return self.token_dispatcher.experts_compute(self.experts, hidden_states, probs,
                                                     layer_number), None

    MoELayer.__init__ = _mark(__init__)
    MoELayer.routed_experts_compute = _mark(mok_routed_experts_compute)


@contextlib.contextmanager
def _as_megatron_dispatcher(config):
    """Temporarily present a ``mok`` config to Megatron as an ``allgather`` one, with no
    megakernel backend (newer Megatron would build its own on ``moe_megakernel_backend``).
    Yields the config's own values of the fields it changes."""
    saved = {"moe_token_dispatcher_type": config.moe_token_dispatcher_type}
    config.moe_token_dispatcher_type = "allgather"
    fields = {f.name: f for f in dataclasses.fields(config)}
    if "moe_megakernel_backend" in fields:
        saved["moe_megakernel_backend"] = config.moe_megakernel_backend
        config.moe_megakernel_backend = fields["moe_megakernel_backend"].default
    try:
        yield dict(saved)
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def patch_arguments() -> None:
    # import_module, not `from megatron.training import arguments`: under the autoload hook this
    # runs before the package megatron.training has the attribute.
    arguments = importlib.import_module("megatron.training.arguments")

    add_megatron_arguments = arguments.add_megatron_arguments
    if _is_patched(add_megatron_arguments):
        return

    @functools.wraps(add_megatron_arguments)
    def with_mok_arguments(parser):
        from .recipe import RECIPE_ENV, RECIPE_FLAG

        parser = add_megatron_arguments(parser)
        group = parser.add_argument_group(title="mok_megatron")
        group.add_argument(
            RECIPE_FLAG,
            default=None,
            metavar="NAME_OR_PATH",
            help=f"Recipe of the mok dispatcher: a name under configs/recipes (bf16, mxfp8, "
                 f"fp8_blockwise) or a YAML path. Default: ${RECIPE_ENV}, else bf16 with backend "
                 f"auto.",
        )
        return parser

    # parse_args looks the function up in its module at call time.
    arguments.add_megatron_arguments = _mark(with_mok_arguments)
