"""Megatron's MoELayer on CPU over gloo, for the tests of the ``mok`` adapter.

Megatron's MoE code calls a few CUDA-only functions even for CPU tensors: its router places
buffers on ``torch.cuda.current_device()``, the alltoall dispatcher copies split sizes on a CUDA
stream, attention dropout forks a CUDA RNG stream, and the checkpoint writer synchronizes the
device. ``patch_megatron_for_cpu`` replaces them in a test worker only; the adapter itself calls
none of them. Megatron's optimizer and schedules go further (tensors made with
``device='cuda'``, parameter types checked against ``torch.cuda.*Tensor``): code that trains runs
inside ``cuda_calls_on_cpu()``. The collectives need nothing: gloo (torch 2.11) has all that DDP
and the distributed optimizer use, ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` in
bf16 and fp32, async and coalesced.

``run_distributed(world_size, fn, *args, expert_model_parallel_size=EP)`` runs ``fn(*args)`` on
``world_size`` spawned gloo ranks with ``mok`` registered and Megatron's model-parallel state set
up for EP (default: world_size; the rest of the ranks are expert data parallelism), and returns
each rank's result.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

HIDDEN = 16
FFN = 8
NUM_EXPERTS = 4
TOPK = 2
TOKENS = (6, 2)  # [sequence, batch] per rank

# Each case: TransformerConfig overrides on top of base_config(); together they cover a gated
# and a non-gated activation, the shared expert, the aux-loss and z-loss routers, the fp32
# router, bf16 parameters and token dropping.
CASES = {
    "swiglu_shared_auxloss": dict(
        gated_linear_unit=True,
        activation_func=F.silu,
        moe_shared_expert_intermediate_size=FFN,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-2,
    ),
    "gelu_zloss_fp32router": dict(
        moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=1e-2,
        moe_z_loss_coeff=1e-3,
        moe_router_dtype="fp32",
    ),
    "squared_relu_bf16_capacity": dict(
        activation_func="squared_relu",
        bf16=True,
        params_dtype=torch.bfloat16,
        moe_router_dtype="fp32",
        moe_shared_expert_intermediate_size=FFN,
        moe_expert_capacity_factor=1.0,
    ),
}


# The smallest valid mok TransformerConfig (SwiGLU, no bias): the support-matrix tests vary it.
MOK_CONFIG = dict(
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


class _NoStream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args):
        pass

    def wait_event(self, *args):
        pass

    def synchronize(self):
        pass

    def record_event(self, *args):
        return self

    def __eq__(self, other):
        return isinstance(other, _NoStream)

    __hash__ = object.__hash__


class _NoCudaRngTracker:
    """Megatron forks its CUDA RNG streams around dropout. CPU has none, and the dropout rates of
    these tests are 0, so nothing is drawn inside the fork."""

    def fork(self, *args, **kwargs):
        return contextlib.nullcontext()


def patch_megatron_for_cpu() -> None:
    from megatron.core import tensor_parallel
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from megatron.core.transformer.moe import token_dispatcher

    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.Stream = _NoStream
    torch.cuda.current_stream = lambda *args, **kwargs: _NoStream()
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    torch.cuda.synchronize = lambda *args, **kwargs: None

    # On GPU the split sizes come back from the device as numpy arrays; CPU tensors stay
    # tensors, which all_to_all_single does not take.
    def to_host(tensor, as_numpy=False, record_stream=False):
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host
    tensor_parallel.get_cuda_rng_tracker = _NoCudaRngTracker
    # Its writer logs memory use through psutil, which this environment may lack.
    filesystem_async._process_memory = lambda: 0


class _CudaCallsOnCpu(TorchFunctionMode):
    """A ``device='cuda'`` argument becomes ``'cpu'``, ``Tensor.cuda()`` returns the tensor, and
    ``Tensor.type()`` names a CPU tensor by its CUDA type (``torch.cuda.BFloat16Tensor``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.cuda:
            return args[0]
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def recipe_file(tmp_path, **fields) -> str:
    """A recipe YAML with `fields` (top-level keys) under tmp_path; its path."""
    path = tmp_path / "recipe.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    return str(path)


def cuda_calls_on_cpu():
    """Context in which Megatron's optimizer and schedules run on CPU tensors."""
    return _CudaCallsOnCpu()


def config_values(dispatcher: str, world_size: int, **overrides) -> dict:
    """The TransformerConfig fields of the tests' small MoE layer (GELU experts unless
    overridden), for TransformerConfig or a Bridge-style provider."""
    from megatron.core.activations import squared_relu

    if overrides.get("activation_func") == "squared_relu":
        overrides["activation_func"] = squared_relu
    values = dict(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=2,
        num_moe_experts=NUM_EXPERTS,
        moe_router_topk=TOPK,
        moe_ffn_hidden_size=FFN,
        moe_token_dispatcher_type=dispatcher,
        expert_model_parallel_size=world_size,
        activation_func=F.gelu,
        add_bias_linear=False,
        bias_activation_fusion=False,
        use_cpu_initialization=True,
    )
    values.update(overrides)
    return values


def base_config(dispatcher: str, world_size: int, **overrides):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**config_values(dispatcher, world_size, **overrides))


def build_moe_layer(dispatcher: str, seed: int, megakernel_backend=None, **overrides):
    """Megatron's MoELayer from its own local (no-TE) spec: SequentialMLP experts.
    ``megakernel_backend`` sets newer Megatron's ``moe_megakernel_backend`` spelling."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec

    config = base_config(dispatcher, dist.get_world_size(), **overrides)
    if megakernel_backend is not None:
        config.moe_megakernel_backend = megakernel_backend
    spec = get_moe_module_spec(use_te=False, num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
    torch.manual_seed(seed)
    return spec(config=config)


def layer_tensors(layer) -> dict[str, torch.Tensor]:
    return {k: v for k, v in layer.state_dict().items() if torch.is_tensor(v)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, expert_model_parallel_size, port, out_dir, fn, args):
    # A crash in C++ (SIGABRT, SIGSEGV) leaves no Python traceback; faulthandler writes one to
    # a file that run_distributed puts into its error.
    fault_log = open(os.path.join(out_dir, f"rank{rank}.fault"), "w")
    faulthandler.enable(fault_log, all_threads=True)
    # Megatron wraps some router/loss helpers in torch.compile; compiling them with inductor
    # on a cold cache is slow on a 2-core CI machine and tests nothing of ours. Eager.
    torch._dynamo.config.disable = True
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from megatron.core import parallel_state

        from mok_megatron.megatron import register

        patch_megatron_for_cpu()
        register()
        parallel_state.initialize_model_parallel(
            expert_model_parallel_size=expert_model_parallel_size
        )
        torch.save(fn(*args), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    # The result is on disk. Leave without interpreter teardown: CI once saw these workers
    # abort (SIGABRT) late in their run, where exactly is unknown; teardown is not under test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# A rank segfaulting inside a torch.distributed collective - its innermost Python frame in
# torch/distributed/distributed_c10d.py - seen three times in about fifteen CI runs, always in
# gloo's coalesced collectives under Megatron's overlapped buckets (the reduce-scatter's
# _coalescing_manager twice, the parameter all-gather's _CoalescingManager.wait once), under CPU
# load, never when rerun (docs/megatron.md): such a run is repeated once, loudly; a second
# crash, or any other, fails.
C10D_MODULE = os.path.join("torch", "distributed", "distributed_c10d.py")
_FRAME = re.compile(r'File "([^"]+)", line \d+ in ')


def crashed_in_c10d(dump: str) -> bool:
    """A rank's fault dump (faulthandler's) is a segfault or an abort whose first listed thread
    was inside torch.distributed's c10d module (gloo's CPU collectives fail both ways, rarely:
    a CI run on 2026-12-05 saw an abort in a DDP parameter all-gather's wait)."""
    if "Segmentation fault" not in dump and "Fatal Python error: Aborted" not in dump:
        return False
    frame = _FRAME.search(dump)
    return frame is not None and frame.group(1).endswith(C10D_MODULE)


def run_distributed(world_size: int, fn, *args, expert_model_parallel_size=None,
                    retries: int = 1) -> list:
    ep = expert_model_parallel_size or world_size
    with tempfile.TemporaryDirectory() as out_dir:
        try:
            mp.spawn(_entry, args=(world_size, ep, _free_port(), out_dir, fn, args),
                     nprocs=world_size)
        except mp.ProcessExitedException as exc:
            dumps, texts = [], []
            for r in range(world_size):
                path = os.path.join(out_dir, f"rank{r}.fault")
                text = open(path).read().strip() if os.path.exists(path) else ""
                texts.append(text)
                done = os.path.exists(os.path.join(out_dir, f"rank{r}.pt"))
                dumps.append(f"--- rank {r} (result written: {done}) ---\n{text or '(no dump)'}")
            report = f"{exc}\n" + "\n".join(dumps)
            if retries > 0 and any(map(crashed_in_c10d, texts)):
                print(f"run_distributed: a rank crashed inside a torch.distributed collective "
                      f"(gloo); running again once\n{report}", file=sys.stderr)
                return run_distributed(world_size, fn, *args, expert_model_parallel_size=ep,
                                       retries=retries - 1)
            raise RuntimeError(report) from exc
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]
