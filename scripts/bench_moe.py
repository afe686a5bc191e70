"""Side-by-side MoE layer benchmark: one torchrun process group, one run, the same weights and
routing through (a) mok (functional.moe_experts, CUDA backend), (b) Megatron's own alltoall
dispatcher (MoEAlltoAllTokenDispatcher) around grouped-GEMM experts - TEGroupedMLP-style
torch._grouped_mm over the same stacked weights (never a per-expert loop) - and (c) flex +
HybridEP / DeepEP where importable (reported as skipped otherwise).

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    torchrun --nproc-per-node 2 scripts/bench_moe.py --models qwen3_30b_a3b_like \
        --tokens 2048 4096 8192 --out benchmarks/results/h200x2-<date>-<what>

Each model runs with its full expert count and as its EP64-equivalent. Outputs are checked
against each other before timing. Times: CUDA events after warm-up (each timing starts after
0.3 s of dense matmuls, so no path gains from a cooler GPU), per iteration the max
over ranks, then the median over iterations; "bwd" is (fwd+bwd) - fwd. The roofline has
three terms (shared/DESIGN.md section 4), each with peaks measured in this run: tensor cores
(FLOPs / grouped-GEMM rate), HBM (weights read once + weight grads written + expert
activations, / copy bandwidth), NVLink (rows that cross GPUs per direction, / peer-copy
bandwidth). The largest binds; "roof" is that floor over the measured time. The routed
experts only: the shared expert is a dense MLP identical for every dispatcher.

    ... scripts/bench_moe.py --recipe mxfp8 fp8_blockwise --models deepseek_v3_like

times the quantized recipes next to bf16 in the same run (--mxfp8-megakernel adds mxfp8 on the
forward megakernel, --mxfp8-megakernels on both), with bytes dispatched per row and peak
memory. --streamed adds each path's time per call with the calls issued back to back (the host
running ahead, as in training) next to the synchronized per-call times, which count a call's
host time before its first kernel in full (docs/perf-log.md, Blockwise FP8, 2026-12-05).

    python scripts/bench_moe.py --suite

runs the whole product's benchmark in under 10 minutes on one H100 (scripts/bench_suite.py):
every suite shape x recipe x kernel path and the baselines, correctness first, into
benchmarks/results/<card>-<date>/ (--out overrides). Started without torchrun, the script runs
itself under torchrun with one process per visible GPU (EP = GPUs) and NVLink multicast off;
--suite --dry-run prints the suite's plan and estimated time without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

STARTED = time.monotonic()  # what the suite's running total counts from (imports included)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpu_timing import mean_seconds, per_call_seconds, precondition  # noqa: E402
from mok_megatron.activations import get_activation  # noqa: E402
from mok_megatron.config import KernelKnobs, Recipe, load_dispatcher, load_model  # noqa: E402
from mok_megatron.functional import moe_experts  # noqa: E402
from mok_megatron.cuda import mxfp8_weights  # noqa: E402
from mok_megatron.cuda.symm_moe import (fp8_wire_row, mxfp8_weight_form,  # noqa: E402
                                   quantized_operands)

# The quantized recipes' paths: recipe precision, kernel.mxfp8_weights ("auto" for
# mok_mxfp8; the forms forced by --mxfp8-weights get paths of their own), kernel.forward_kernel
# (--mxfp8-megakernel: the forward megakernel, backward separate) and kernel.backward_kernel
# (--mxfp8-megakernels: both megakernels, recomputed inputs, auto's weights rounded);
# --fp8-blockwise-megakernel: fp8_blockwise on the forward megakernel, backward separate;
# --fp8-blockwise-megakernels: on both megakernels (recomputed inputs).
QUANTIZED_PATHS = {"mok_mxfp8": ("mxfp8", "auto", "separate", "separate"),
                   "mok_mxfp8_codes": ("mxfp8", "codes", "separate", "separate"),
                   "mok_mxfp8_rounded": ("mxfp8", "rounded", "separate", "separate"),
                   "mok_mxfp8_megakernel": ("mxfp8", "auto", "megakernel", "separate"),
                   "mok_mxfp8_codes_megakernel": ("mxfp8", "codes", "megakernel", "separate"),
                   "mok_mxfp8_rounded_megakernel": ("mxfp8", "rounded", "megakernel",
                                                    "separate"),
                   "mok_mxfp8_megakernels": ("mxfp8", "auto", "megakernel", "megakernel"),
                   "mok_fp8_blockwise": ("fp8_blockwise", "auto", "separate", "separate"),
                   "mok_fp8_blockwise_megakernel": ("fp8_blockwise", "auto", "megakernel",
                                                    "separate"),
                   "mok_fp8_blockwise_megakernels": ("fp8_blockwise", "auto", "megakernel",
                                                     "megakernel")}

# Largest relative L2 error against Megatron's alltoall (BF16) a path may show, per recipe
# precision, in each of y, dx, dprobs and the weight gradients: BF16 paths agree to bf16
# rounding; MXFP8 rounds every GEMM operand to 3 mantissa bits (rel-L2 6.8e-2 against alltoall
# in docs/perf-log.md, MXFP8 v1, 2026-12-02), blockwise FP8 likewise.
CHECK_TOLERANCE = {"bf16": 2e-2, "mxfp8": 0.15, "fp8_blockwise": 0.15}
CHECKED = ("y", "dx", "dprobs", "dw1", "dw2")

# NVLink multicast must stay off (shared/DESIGN.md section 4): NCCL, torch symmetric memory and
# NVSHMEM read these when they start.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
# The command as typed, passed to the processes the script starts under torchrun.
COMMAND_ENV = "MOK_BENCH_COMMAND"
DEFAULT_MODELS = ["qwen3_30b_a3b_like", "deepseek_v3_like", "mok_bench"]


def log0(*a):
    if dist.get_rank() == 0:
        print(*a, flush=True)


# ------------------------------------------------------------------------------ peaks


def measure_peaks(world: int) -> dict:
    """bf16 grouped-GEMM rate, HBM copy rate (read+write), one-way peer copy rate."""
    dev = torch.device("cuda")
    groups, rows, k, n = 8, 8192, 7168, 4096
    a = torch.randn(groups * rows, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(groups, n, k, device=dev, dtype=torch.bfloat16)
    offs = torch.arange(1, groups + 1, device=dev, dtype=torch.int32) * rows
    t = mean_seconds(lambda: torch._grouped_mm(a, b.transpose(1, 2), offs=offs))
    gemm = 2 * groups * rows * k * n / t
    del a, b
    src = torch.randn(2**30, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    hbm = 2 * src.numel() * 2 / mean_seconds(lambda: dst.copy_(src))
    del src, dst
    link = float("nan")
    if world > 1:
        import torch.distributed._symmetric_memory as symm_mem

        nbytes = 512 * 2**20
        buf = symm_mem.empty(nbytes, dtype=torch.uint8, device=dev)
        handle = symm_mem.rendezvous(buf, dist.group.WORLD)
        peer = (dist.get_rank() + 1) % world
        remote = handle.get_buffer(peer, (nbytes,), torch.uint8)
        local = torch.randint(0, 255, (nbytes,), device=dev, dtype=torch.uint8)
        dist.barrier()
        link = nbytes / mean_seconds(lambda: remote.copy_(local))
        dist.barrier()
        del handle, buf
    vals = torch.tensor([gemm, hbm, link], device=dev, dtype=torch.float64)
    dist.all_reduce(vals, op=dist.ReduceOp.MIN)
    return {"grouped_gemm_flops": vals[0].item(), "hbm_bytes_per_s": vals[1].item(),
            "nvlink_bytes_per_s": vals[2].item()}


# ------------------------------------------------------------------------------ problem


def make_problem(model, num_experts: int, tokens: int, seed: int):
    world, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda")
    H, Fh, K = model.hidden_size, model.moe_ffn_hidden_size, model.topk
    local = num_experts // world
    g = torch.Generator(device=dev).manual_seed(seed * 1000 + rank)
    x = torch.randn(tokens, H, device=dev, dtype=torch.bfloat16, generator=g)
    scores = torch.rand(tokens, num_experts, device=dev, generator=g)
    ids = scores.topk(K, dim=1).indices.to(torch.int32)
    probs = torch.softmax(torch.randn(tokens, K, device=dev, generator=g), dim=1)
    gw = torch.Generator(device=dev).manual_seed(seed * 1000 + 500 + rank)
    w1 = (torch.randn(local, 2 * Fh, H, device=dev, dtype=torch.bfloat16, generator=gw)
          * H**-0.5).requires_grad_()
    w2 = (torch.randn(local, H, Fh, device=dev, dtype=torch.bfloat16, generator=gw)
          * Fh**-0.5).requires_grad_()
    dy = torch.randn(tokens, H, device=dev, dtype=torch.bfloat16, generator=g)
    return x, ids, probs, w1, w2, dy


def row_counts(ids: torch.Tensor, num_experts: int) -> tuple[int, int]:
    """(rows this rank's experts compute, of them the ones from other ranks): max over ranks."""
    world, rank = dist.get_world_size(), dist.get_rank()
    local = num_experts // world
    dest = ids.long() // local
    sent = torch.bincount(dest.flatten(), minlength=world)
    recv = torch.empty_like(sent)
    dist.all_to_all_single(recv, sent)
    rows = recv.sum()
    remote = rows - recv[rank]
    both = torch.stack([rows, remote, sent.sum() - sent[rank]])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return int(both[0]), int(max(both[1], both[2]))


# ------------------------------------------------------------------------------ paths


def mok_path(group, tokens, forward_kernel="separate", comm_sms=16,
             backward_inputs=KernelKnobs.backward_inputs,
             macrobatch_tokens=KernelKnobs.macrobatch_tokens,
             minibatch_tokens=KernelKnobs.minibatch_tokens, backward_kernel="separate",
             comm_sms_backward=KernelKnobs.comm_sms_backward, precision="bf16",
             mxfp8_weights="auto", kept_h_tokens=0):
    recipe = Recipe(name="bench", precision=precision, backend="cuda",
                    kernel=KernelKnobs(max_tokens_per_rank=max(tokens, 1),
                                       mxfp8_weights=mxfp8_weights,
                                       forward_kernel=forward_kernel, comm_sms_forward=comm_sms,
                                       backward_kernel=backward_kernel,
                                       comm_sms_backward=comm_sms_backward,
                                       backward_inputs=backward_inputs,
                                       kept_h_tokens=kept_h_tokens,
                                       macrobatch_tokens=macrobatch_tokens,
                                       minibatch_tokens=minibatch_tokens))

    return MokPath(group, recipe)


class MokPath:
    """moe_experts on the group under one recipe."""

    def __init__(self, group, recipe: Recipe):
        self.group, self.recipe = group, recipe

    def __call__(self, x, ids, probs, w1, w2):
        return moe_experts(x, ids, probs, w1, w2, group=self.group, recipe=self.recipe)

    def dispatch_bytes_per_row(self, hidden: int) -> int:
        """What forward's pull moves per row: the bf16 row, or the FP8 wire row (codes and
        scale codes) where the recipe dispatches one."""
        wire = fp8_wire_row(hidden, self.recipe)
        return hidden * 2 if wire is None else wire.row_bytes


class MegatronBaseline:
    """Megatron-Core's own token dispatcher around grouped-GEMM SwiGLU experts with probs
    applied after the activation, as TEGroupedMLP does: "alltoall" (MoEAlltoAllTokenDispatcher:
    its own permute, all-to-all with host-read splits, sort by expert, and the reverse) or
    "hybridep" (MoEFlexTokenDispatcher on DeepEP's HybridEP kernels), each as
    configs/dispatchers/<name>.yaml names it. Both take the same six hooks. Where what the
    dispatcher requires is not installed, the constructor raises ImportError saying how to
    install it."""

    DISPATCHERS = {"alltoall": {"moe_token_dispatcher_type": "alltoall"},
                   "hybridep": {"moe_token_dispatcher_type": "flex",
                                "moe_flex_dispatcher_backend": "hybridep"}}

    def __init__(self, model, num_experts: int, dispatcher: str = "alltoall"):
        world, rank = dist.get_world_size(), dist.get_rank()
        local = num_experts // world
        if dispatcher == "hybridep" and num_experts % 4:
            # HybridEP's own config check (deep_ep hybrid-ep, config.cuh) asserts "The config is
            # not valid" at the first dispatch unless experts per rank x ranks per NVLink
            # domain (here the whole group) is a multiple of 4.
            raise ValueError(f"HybridEP needs experts per rank x ranks per NVLink domain to be "
                             f"a multiple of 4: {local} x {world}")
        load_dispatcher(dispatcher).check_available()
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.transformer.moe.token_dispatcher import (MoEAlltoAllTokenDispatcher,
                                                                    MoEFlexTokenDispatcher)
        from megatron.core.transformer.transformer_config import TransformerConfig

        config = TransformerConfig(
            num_layers=1, hidden_size=model.hidden_size, num_attention_heads=8,
            num_moe_experts=num_experts, moe_router_topk=model.topk,
            moe_ffn_hidden_size=model.moe_ffn_hidden_size,
            expert_model_parallel_size=world, add_bias_linear=False, bf16=True,
            params_dtype=torch.bfloat16, gated_linear_unit=True, activation_func=F.silu,
            moe_grouped_gemm=True, moe_permute_fusion=False, **self.DISPATCHERS[dispatcher])
        pgs = ProcessGroupCollection.use_mpu_process_groups()
        cls = MoEFlexTokenDispatcher if dispatcher == "hybridep" else MoEAlltoAllTokenDispatcher
        self.num_experts = num_experts
        self.dispatcher = cls(local, list(range(rank * local, (rank + 1) * local)),
                              config=config, pg_collection=pgs)

    def __call__(self, x, ids, probs, w1, w2):
        d = self.dispatcher
        T = x.shape[0]
        routing_map = torch.zeros(T, self.num_experts, dtype=torch.bool, device=x.device)
        routing_map.scatter_(1, ids.long(), True)
        # fp32, as the probs are: HybridEP takes fp32 probs only.
        dense = torch.zeros(T, self.num_experts, dtype=probs.dtype, device=x.device)
        dense = dense.scatter(1, ids.long(), probs)
        hidden, p = d.dispatch_preprocess(x, routing_map, dense)
        hidden, p = d.token_dispatch(hidden, p)
        hidden, tokens_per_expert, permuted_probs = d.dispatch_postprocess(hidden, p)
        offs = torch.cumsum(tokens_per_expert.to(x.device), 0).to(torch.int32)
        h = torch._grouped_mm(hidden, w1.transpose(1, 2), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        act = (F.silu(gate.float()) * up.float() * permuted_probs.reshape(-1, 1)).to(h.dtype)
        out = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs)
        out = d.combine_preprocess(out)
        out = d.token_combine(out)
        return d.combine_postprocess(out)


def optional_baselines() -> dict[str, str]:
    """flex + HybridEP / DeepEP: whether the packages import (else why not)."""
    status = {}
    for name, module, attr, where in (
            ("flex+hybridep", "deep_ep", "HybridEPBuffer", "timed by --suite"),
            ("flex+deepep", "deep_ep", "Buffer", "not wired into this benchmark")):
        try:
            getattr(__import__(module), attr)
            status[name] = f"importable, {where}"
        except (ImportError, AttributeError) as err:
            status[name] = f"skipped: {err}"
    return status


# ------------------------------------------------------------------------------ timing


def timed(fn, iters: int, warmup: int) -> float:
    """Median over iterations of the max over ranks, seconds, after precondition()."""
    precondition()
    def start_together():
        dist.barrier()
        torch.cuda.synchronize()

    t = torch.tensor(per_call_seconds(fn, iters, warmup, start_together), device="cuda",
                     dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.median().item()


def streamed_seconds(fn, iters: int, warmup: int) -> float:
    """Mean seconds per call of `iters` calls issued back to back (one event pair around them,
    the max over ranks), after precondition(): the host runs ahead of the GPU as in training,
    so host time hides behind kernels unless a call synchronizes (alltoall reads its split sizes
    on the host). `timed` synchronizes around every call, so a call's host time before its
    first kernel, and any launch that blocks the host, count there in full."""
    precondition()
    dist.barrier()
    torch.cuda.synchronize()
    t = torch.tensor(mean_seconds(fn, iters, warmup), device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def graph_seconds(step, iters: int, warmup: int) -> float:
    """`step` (the no-grad forward, or forward + backward) captured once as a CUDA graph and
    replayed, timed as `timed` does: the layer's GPU time without the host's launch latency,
    as a training step captured in CUDA graphs sees it. Only for paths without host
    synchronization (not alltoall, which reads its split sizes on the host)."""
    # Memory the caching allocator holds unused (earlier paths' buffers) goes back first: the
    # graph's private pool cannot reuse it.
    torch.cuda.empty_cache()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    seconds = timed(graph.replay, iters, warmup)
    del graph
    torch.cuda.empty_cache()
    return seconds


def kept_bytes(forward) -> int:
    """What a forward with autograd keeps allocated for its backward (activations, saved
    rows, schedules), its output aside, max over ranks: the memory a model holds per MoE
    layer between the layer's forward and its backward."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = forward()
    torch.cuda.synchronize()
    kept = torch.tensor(torch.cuda.memory_allocated() - before - y.numel() * y.element_size(),
                        device="cuda")
    del y
    dist.all_reduce(kept, op=dist.ReduceOp.MAX)
    return int(kept.item())


def peak_bytes(step) -> int:
    """Memory one call of `step` allocates at its peak beyond what was allocated before it,
    max over ranks. For forward + backward with no gradients allocated before: the layer's
    activations, what forward keeps for backward, transient buffers, and the gradients
    (the same for every path: grad_bytes)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.tensor(torch.cuda.max_memory_allocated() - before, device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return int(peak.item())


def layer_flops(rows: int, hidden: int, ffn: int, gated: bool, backward: bool) -> int:
    """FLOPs the expert MLPs must do for `rows` routed token copies (tokens x top-k): forward
    FC1 (2 rows H F1, F1 = 2F for a gated activation's [gate | up], else F) and FC2 (2 rows F
    H), so 6 rows H F for SwiGLU; backward twice forward (dgrad and wgrad of each GEMM).
    Recomputing FC1 in backward (backward_inputs: recomputed) is a setting's cost, not work
    the layer must do: never counted, so '% of roofline' compares settings on the same work."""
    fc1_rows = 2 * ffn if gated else ffn
    forward = 2 * rows * hidden * (fc1_rows + ffn)
    return forward * (3 if backward else 1)


def roofline(model, rows, remote_rows, local_experts, peaks, backward: bool) -> dict:
    """The three-term floor of one call (shared/DESIGN.md section 4) at the peaks measured in
    this run: tensor cores (layer_flops / the bf16 grouped-GEMM rate, for every recipe), HBM
    (weights read once per pass, weight gradients written, expert activations) and NVLink (rows
    that cross GPUs, per direction); the largest binds."""
    H, Fh = model.hidden_size, model.moe_ffn_hidden_size
    gated = get_activation(model.activation).gated
    F1 = 2 * Fh if gated else Fh
    flops = layer_flops(rows, H, Fh, gated, backward)
    weight_bytes = local_experts * (F1 + Fh) * H * 2
    # Per row: x read and y written (H each), h written and read (F1 each), act written and
    # read (F each), bf16.
    act_bytes = rows * (2 * H + 2 * F1 + 2 * Fh) * 2
    hbm = weight_bytes * (2 if backward else 1) + act_bytes * (2 if backward else 1)
    if backward:
        hbm += weight_bytes  # forward reads the weights too
    link = 2 * remote_rows * H * 2 * (2 if backward else 1)
    terms = {"tensor": flops / peaks["grouped_gemm_flops"],
             "hbm": hbm / peaks["hbm_bytes_per_s"],
             "nvlink": (link / peaks["nvlink_bytes_per_s"]) if remote_rows else 0.0}
    binding = max(terms, key=terms.get)
    return {"flops": flops, "terms_s": terms, "binding": binding, "floor_s": terms[binding]}


def rel_l2(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def clear_grads(leaves) -> None:
    for t in leaves:
        t.grad = None


def layer_outputs(fn, x, ids, probs, w1, w2, dy) -> list[torch.Tensor]:
    """One forward + backward through `fn` on leaves x, probs, w1, w2: y and the gradients
    CHECKED names, of the weights the first two experts' only (full clones of several paths'
    gradients would not fit beside the weights on the largest shapes)."""
    leaves = (x, probs, w1, w2)
    clear_grads(leaves)
    y = fn(x, ids, probs, w1, w2)
    y.backward(dy)
    outs = [y.detach(), x.grad.clone(), probs.grad.clone(), w1.grad[:2].clone(),
            w2.grad[:2].clone()]
    clear_grads(leaves)
    return outs


def check_errors(outs, reference) -> dict[str, float]:
    """The relative L2 error of each output CHECKED names against the reference's."""
    return {f: rel_l2(a, b) for f, a, b in zip(CHECKED, outs, reference)}


def forward_step(fn, x, ids, probs, w1, w2):
    """The no-grad forward that "fwd" times."""
    def fwd():
        with torch.no_grad():
            fn(x, ids, probs, w1, w2)
    return fwd


def train_step(fn, ids, dy, leaves):
    """Forward + backward on leaves x, probs, w1, w2, their gradients cleared first."""
    x, probs, w1, w2 = leaves

    def step():
        clear_grads(leaves)
        fn(x, ids, probs, w1, w2).backward(dy)
    return step


def measure_path(fn, x, ids, probs, w1, w2, dy, iters: int, warmup: int) -> dict:
    """fwd and fwd+bwd seconds (`timed`), bwd their difference; the peak memory of each beyond
    what was allocated before (fwd+bwd's includes the gradients, grad_bytes), and what forward
    keeps for backward."""
    leaves = (x, probs, w1, w2)
    fwd, both = forward_step(fn, x, ids, probs, w1, w2), train_step(fn, ids, dy, leaves)
    tf, tb = timed(fwd, iters, warmup), timed(both, iters, warmup)
    clear_grads(leaves)
    measured = {"fwd_s": tf, "both_s": tb, "bwd_s": tb - tf, "peak_fwd_bytes": peak_bytes(fwd),
                "peak_both_bytes": peak_bytes(both),
                "kept_for_backward_bytes": kept_bytes(lambda: fn(x, ids, probs, w1, w2))}
    clear_grads(leaves)
    return measured


def run_case(model, variant, tokens, peaks, args, group):
    world = dist.get_world_size()
    spec = model if variant == "full" else model.ep64_equivalent(world)
    E = spec.num_experts
    x, ids, probs, w1, w2, dy = make_problem(model, E, tokens, args.seed)
    rows, remote = row_counts(ids, E)
    paths = {"mok": mok_path(group, tokens, backward_inputs=args.backward_inputs),
             "alltoall": MegatronBaseline(model, E)}
    if args.megakernel or args.mxfp8_megakernel or args.fp8_blockwise_megakernel:
        # The BF16 forward megakernel (backward separate): the mxfp8 megakernel's baseline.
        paths["mok_megakernel_fwd_only"] = mok_path(group, tokens, "megakernel", args.comm_sms,
                                                    args.backward_inputs,
                                                    args.macrobatch_tokens)
    if args.megakernel:
        # main's megakernel path before the backward megakernel (megakernel forward, separate
        # backward), and both megakernels.
        paths["mok_megakernel"] = mok_path(group, tokens, "megakernel", args.comm_sms,
                                           args.backward_inputs, args.macrobatch_tokens,
                                           backward_kernel="megakernel",
                                           comm_sms_backward=args.comm_sms_backward)
        if args.backward_inputs == "recomputed":
            # Both megakernels keeping forward's rows, h and act instead: what recomputing
            # through the rings costs, in the same run.
            paths["mok_megakernel_saved"] = mok_path(group, tokens, "megakernel", args.comm_sms,
                                                     "saved", backward_kernel="megakernel",
                                                     comm_sms_backward=args.comm_sms_backward)
    if args.kept_h:
        # The default kernels (auto) per recipe: saved inputs, recomputed, and recomputed past
        # h kept for a fraction of the rows per rank (kernel.kept_h_tokens, from T x topk).
        for precision in args.kept_h_recipes:
            for inputs, fraction in (("saved", 0), ("recomputed", 0),
                                     *(("recomputed", f) for f in args.kept_h)):
                name = kept_h_path(precision, inputs, fraction)
                paths[name] = mok_path(group, tokens, "auto", args.comm_sms, inputs,
                                       backward_kernel="auto", precision=precision,
                                       kept_h_tokens=math.ceil(fraction * tokens * model.topk))
    # The quantized recipes (operands.py: the separate kernels on quantized operands, the
    # weights quantized once per optimizer step - timed apart below, as the bench steps no
    # optimizer).
    forms = ["mok_mxfp8" + ("" if f == "auto" else f"_{f}") for f in args.mxfp8_weights]
    wanted = ((forms if args.mxfp8 else [])
              + ([f"{f}_megakernel" for f in forms] if args.mxfp8_megakernel else [])
              + (["mok_mxfp8_megakernels"] if args.mxfp8_megakernels else [])
              + (["mok_fp8_blockwise"] if args.fp8_blockwise else [])
              + (["mok_fp8_blockwise_megakernel"] if args.fp8_blockwise_megakernel else [])
              + (["mok_fp8_blockwise_megakernels"] if args.fp8_blockwise_megakernels else []))
    for name in wanted:
        precision, form, forward_kernel, backward_kernel = QUANTIZED_PATHS[name]
        paths[name] = mok_path(group, tokens, forward_kernel, args.comm_sms,
                               backward_inputs=("recomputed" if "megakernel" in
                                                (forward_kernel, backward_kernel)
                                                else args.backward_inputs),
                               macrobatch_tokens=args.macrobatch_tokens, precision=precision,
                               mxfp8_weights=form, backward_kernel=backward_kernel,
                               comm_sms_backward=args.comm_sms_backward)
    leaves = [x.requires_grad_(), probs.requires_grad_(), w1, w2]

    outs = {name: layer_outputs(fn, x, ids, probs, w1, w2, dy) for name, fn in paths.items()}
    checks = {name: check_errors(outs[name], outs["alltoall"])
              for name in outs if name != "alltoall"}
    check = checks["mok"]
    bound = {name: CHECK_TOLERANCE[fn.recipe.precision] for name, fn in paths.items()
             if isinstance(fn, MokPath)}
    worst = torch.tensor(max(max(c.values()) / bound[n] for n, c in checks.items()),
                         device="cuda")
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if worst.item() > 1:
        raise RuntimeError(f"{spec.name} T={tokens}: mok and alltoall disagree: {checks}")
    del outs

    result = {"model": model.name, "variant": variant, "experts": E, "tokens_per_gpu": tokens,
              "rows_max": rows, "remote_rows_max": remote, "check_rel_l2": check, "paths": {},
              "grad_bytes": sum(t.numel() * t.element_size() for t in leaves)}
    for name in checks:
        if name != "mok":
            result[f"check_rel_l2_{name}"] = checks[name]
    for name, fn in paths.items():
        fwd, both = forward_step(fn, x, ids, probs, w1, w2), train_step(fn, ids, dy, leaves)
        result["paths"][name] = {**measure_path(fn, x, ids, probs, w1, w2, dy, args.iters,
                                                args.warmup),
                                 "dispatch_bytes_per_row": (
                                     fn.dispatch_bytes_per_row(model.hidden_size)
                                     if isinstance(fn, MokPath) else model.hidden_size * 2)}
        if name in QUANTIZED_PATHS:
            entry = result["paths"][name]
            local = E // world
            _, quantize_pair = quantized_operands(fn.recipe, tokens, model.topk, local)
            entry["weights"] = (mxfp8_weight_form(fn.recipe, tokens, model.topk, local)
                                if fn.recipe.precision == "mxfp8" else "codes")
            mxfp8_weights.clear()  # the layer's cache out of the way of the copies timed here
            entry["weight_quantize_s"] = timed(
                lambda: quantize_pair(w1.detach(), w2.detach(), gated=True), args.iters,
                args.warmup)
            cached = quantize_pair(w1.detach(), w2.detach(), gated=True)
            tensors = [t for v in vars(cached).values()
                       for t in ([v] if isinstance(v, torch.Tensor) else vars(v).values())
                       if isinstance(t, torch.Tensor)]
            storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                        for t in tensors}  # every tensor of the cache, once
            entry["weight_cache_bytes"] = sum(storages.values())
            del cached
        if args.streamed:
            entry = result["paths"][name]
            entry["fwd_stream_s"] = streamed_seconds(fwd, args.iters, args.warmup)
            entry["both_stream_s"] = streamed_seconds(both, args.iters, args.warmup)
            clear_grads(leaves)
        if args.cuda_graph and name != "alltoall":
            entry = result["paths"][name]
            entry["fwd_graph_s"] = graph_seconds(fwd, args.iters, args.warmup)
            # The captured backward allocates its gradients in the graph's pool, beside the
            # eager warm-up's; on DeepSeek-V3-like full experts (21 GiB of them) the capture ran
            # out of memory (2026-12-02), so below 6x their size free it is not timed.
            free, _ = torch.cuda.mem_get_info()
            if free < 6 * result["grad_bytes"]:
                entry["both_graph_error"] = (
                    f"not measured: {free / 2**30:.0f} GiB free, a captured fwd+bwd needs a "
                    f"second set of gradients ({result['grad_bytes'] / 2**30:.1f} GiB) and room")
                log0(f"{name}: fwd+bwd CUDA graph {entry['both_graph_error']}")
                continue
            # Leaves of their own (the same storage) for the captured backward: the first
            # capture on 2026-12-05 failed (cudaErrorStreamCaptureImplicit) after PyTorch
            # warned that a gradient accumulator made on another stream by earlier eager
            # calls was kept alive; these leaves' accumulators are made in the warm-up.
            graph_leaves = [t.detach().requires_grad_() for t in leaves]
            try:
                entry["both_graph_s"] = graph_seconds(train_step(fn, ids, dy, graph_leaves),
                                                      args.iters, args.warmup)
                entry["bwd_graph_s"] = entry["both_graph_s"] - entry["fwd_graph_s"]
            except RuntimeError as err:  # recorded and shown, never replaced by another time
                entry["both_graph_error"] = f"{type(err).__name__}: {err}"
                log0(f"{name}: fwd+bwd CUDA graph failed: {entry['both_graph_error']}")
                traceback.print_exc()
                torch.cuda.synchronize()
            clear_grads(leaves + graph_leaves)
    for direction, backward, key in (("fwd", False, "fwd_s"), ("both", True, "both_s")):
        roof = roofline(model, rows, remote, E // world, peaks, backward)
        result[f"roofline_{direction}"] = roof
        for name in paths:
            t = result["paths"][name][key]
            result["paths"][name][f"tflops_{direction}"] = roof["flops"] / t / 1e12
            result["paths"][name][f"roof_{direction}"] = roof["floor_s"] / t
            graph_key = key.replace("_s", "_graph_s")
            if graph_key in result["paths"][name]:
                result["paths"][name][f"roof_{direction}_graph"] = (
                    roof["floor_s"] / result["paths"][name][graph_key])
    base = result["paths"]["alltoall"]
    mok = result["paths"]["mok"]
    result["speedup_vs_alltoall"] = {k: base[k] / mok[k] for k in ("fwd_s", "bwd_s", "both_s")}
    if "mok_megakernel" in result["paths"]:
        mk = result["paths"]["mok_megakernel"]
        main = result["paths"]["mok_megakernel_fwd_only"]
        result["speedup_vs_alltoall_megakernel"] = {k: base[k] / mk[k]
                                                    for k in ("fwd_s", "bwd_s", "both_s")}
        keys = [k for k in mk if k.endswith("_s") and k in main]
        result["speedup_megakernel_vs_fwd_only"] = {k: main[k] / mk[k] for k in keys}
    if "mok_megakernel_saved" in result["paths"]:
        mk, saved = result["paths"]["mok_megakernel"], result["paths"]["mok_megakernel_saved"]
        keys = [k for k in mk if k.endswith("_s") and k in saved]
        result["recomputed_over_saved"] = {k: mk[k] / saved[k] for k in keys}
    if args.kept_h:
        result["kept_h_over_saved"] = {
            precision: {str(f): result["paths"][kept_h_path(precision, "recomputed", f)]["both_s"]
                        / result["paths"][kept_h_path(precision, "saved", 0)]["both_s"]
                        for f in (0, *args.kept_h)}
            for precision in args.kept_h_recipes}
    return result


def kept_h_path(precision: str, inputs: str, fraction: float) -> str:
    """--kept-h's paths: the default kernels under `precision` with `inputs` kept for
    backward, and h of `fraction` of the rows."""
    return (f"mok_auto_{precision}_{inputs}"
            + (f"_kept_h_{round(fraction * 100)}pct" if fraction else ""))


def print_row(r):
    m, b = r["paths"]["mok"], r["paths"]["alltoall"]
    rf, rb = r["roofline_fwd"], r["roofline_both"]
    log0(f"{r['model']:<20} {r['variant']:<5} E={r['experts']:<4} T={r['tokens_per_gpu']:<5} "
         f"fwd mok {m['fwd_s']*1e3:7.2f} ms ({m['tflops_fwd']:5.0f} TF/s, "
         f"{m['roof_fwd']*100:3.0f}% roof[{rf['binding']}]) a2a {b['fwd_s']*1e3:7.2f} ms "
         f"x{r['speedup_vs_alltoall']['fwd_s']:.2f} | fwd+bwd mok {m['both_s']*1e3:7.2f} ms "
         f"({m['roof_both']*100:3.0f}% roof[{rb['binding']}]) a2a {b['both_s']*1e3:7.2f} ms "
         f"x{r['speedup_vs_alltoall']['both_s']:.2f}")
    if "mok_megakernel" in r["paths"]:
        k, f = r["paths"]["mok_megakernel"], r["paths"]["mok_megakernel_fwd_only"]
        speedup = r["speedup_vs_alltoall_megakernel"]["both_s"]
        log0(f"{'':<20} megakernels fwd {k['fwd_s']*1e3:7.2f} ms ({k['roof_fwd']*100:3.0f}% "
             f"roof) bwd {k['bwd_s']*1e3:7.2f} ms fwd+bwd {k['both_s']*1e3:7.2f} ms "
             f"({k['roof_both']*100:3.0f}% roof) x{speedup:.2f} vs a2a, "
             f"x{f['both_s'] / k['both_s']:.2f} vs megakernel fwd + separate bwd "
             f"({f['both_s']*1e3:.2f} ms)")
    if "recomputed_over_saved" in r:
        ratio, saved = r["recomputed_over_saved"], r["paths"]["mok_megakernel_saved"]
        log0(f"{'':<20} megakernels recomputed / saved: fwd x{ratio['fwd_s']:.2f} bwd "
             f"x{ratio['bwd_s']:.2f} fwd+bwd x{ratio['both_s']:.2f} (saved fwd+bwd "
             f"{saved['both_s']*1e3:.2f} ms"
             + (f", graph x{ratio['both_graph_s']:.2f}" if "both_graph_s" in ratio else "")
             + ")")
    for precision, ratios in r.get("kept_h_over_saved", {}).items():
        log0(f"{'':<20} {precision} default kernels, fwd+bwd over saved inputs: " + ", ".join(
            f"{'recomputed' if f == '0' else f'h kept for {float(f):.0%} of the rows'} "
            f"x{ratio:.3f}" for f, ratio in ratios.items()))
    streamed = {n: p for n, p in r["paths"].items() if "fwd_stream_s" in p}
    if streamed:
        log0(f"{'':<20} streamed (calls back to back) fwd / fwd+bwd: " + ", ".join(
            f"{n} {p['fwd_stream_s']*1e3:.2f} / {p['both_stream_s']*1e3:.2f} ms"
            + (f" (x{m['fwd_stream_s'] / p['fwd_stream_s']:.2f} / "
               f"x{m['both_stream_s'] / p['both_stream_s']:.2f} vs bf16)" if n != "mok" else "")
            for n, p in streamed.items()))
    graphed = {n: p for n, p in r["paths"].items() if "fwd_graph_s" in p}
    if graphed:
        log0(f"{'':<20} CUDA graph fwd / fwd+bwd: " + ", ".join(
            f"{n} {p['fwd_graph_s']*1e3:.2f} / {p.get('both_graph_s', float('nan'))*1e3:.2f} ms "
            f"({p.get('roof_both_graph', float('nan'))*100:.0f}% roof)"
            for n, p in graphed.items()))
    for name in QUANTIZED_PATHS:
        if name not in r["paths"]:
            continue
        q, m = r["paths"][name], r["paths"]["mok"]
        # A megakernel's recipe also next to the BF16 path on the same megakernels.
        baseline = ("mok_megakernel_fwd_only" if name.endswith("_megakernel")
                    else "mok_megakernel" if name.endswith("_megakernels") else None)
        mk = r["paths"].get(baseline)
        vs_mk = (f", x{mk['fwd_s'] / q['fwd_s']:.2f} / x{mk['both_s'] / q['both_s']:.2f} vs "
                 f"{baseline[4:]}" if mk else "")
        log0(f"{'':<20} {name[4:]} [{q['weights']}] fwd {q['fwd_s']*1e3:7.2f} ms "
             f"(x{m['fwd_s'] / q['fwd_s']:.2f} vs bf16) fwd+bwd {q['both_s']*1e3:7.2f} ms "
             f"(x{m['both_s'] / q['both_s']:.2f} vs bf16{vs_mk}), vs alltoall rel-L2 "
             f"{max(r['check_rel_l2_' + name].values()):.1e}; weights quantized once per step "
             f"{q['weight_quantize_s']*1e3:.2f} ms, {q['weight_cache_bytes'] / 2**30:.2f} GiB "
             f"cached")
    log0(f"{'':<20} peak memory fwd+bwd beyond the gradients "
         f"({r['grad_bytes'] / 2**30:.2f} GiB): " + ", ".join(
             f"{n} {(p['peak_both_bytes'] - r['grad_bytes']) / 2**30:.2f} GiB"
             for n, p in r["paths"].items()))
    log0(f"{'':<20} kept from forward for backward: " + ", ".join(
        f"{n} {p['kept_for_backward_bytes'] / 2**30:.2f} GiB" for n, p in r["paths"].items()))
    log0(f"{'':<20} dispatch bytes per row: " + ", ".join(
        f"{n} {p['dispatch_bytes_per_row']}" for n, p in r["paths"].items()))


def chart(results, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{r['variant']} T={r['tokens_per_gpu']}" for r in results]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(results) * 1.1), 8))
    for ax, key, title in ((axes[0], "fwd_s", "forward"), (axes[1], "both_s", "forward+backward")):
        xs = range(len(results))
        names = [n for n in ("mok", "mok_megakernel_fwd_only", "mok_megakernel",
                             "mok_megakernel_saved", *QUANTIZED_PATHS, "alltoall")
                 if n in results[0]["paths"]]
        colors = {"mok": "tab:red", "mok_megakernel_fwd_only": "tab:orange",
                  "mok_megakernel": "tab:green", "mok_megakernel_saved": "tab:olive",
                  "mok_mxfp8": "tab:purple", "mok_mxfp8_codes": "tab:pink",
                  "mok_mxfp8_rounded": "tab:cyan", "mok_mxfp8_megakernel": "indigo",
                  "mok_mxfp8_codes_megakernel": "deeppink",
                  "mok_mxfp8_rounded_megakernel": "teal", "mok_mxfp8_megakernels": "navy",
                  "mok_fp8_blockwise": "tab:brown", "mok_fp8_blockwise_megakernel": "sienna",
                  "mok_fp8_blockwise_megakernels": "maroon",
                  "alltoall": "tab:blue"}
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ax.bar([x + (i - (len(names) - 1) / 2) * width for x in xs],
                   [r["paths"][name][key] * 1e3 for r in results], width, label=name,
                   color=colors[name])
        floor_key = "roofline_fwd" if key == "fwd_s" else "roofline_both"
        ax.scatter(list(xs), [r[floor_key]["floor_s"] * 1e3 for r in results], color="black",
                   marker="_", s=400, label="roofline floor", zorder=3)
        ax.set_ylabel("ms (max over ranks, median)")
        ax.set_title(title)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=7)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", action="store_true",
                   help="run the benchmark suite (scripts/bench_suite.py): every suite shape x "
                        "recipe x kernel path and the baselines, correctness first, writing "
                        "results.json, chart.png, COMMAND.txt and README.md into "
                        "benchmarks/results/<card>-<date>/ (or --out); --models, --tokens and "
                        "--recipe narrow it, --iters, --warmup, --seed and --backward-inputs "
                        "apply, the other flags do not")
    p.add_argument("--dry-run", action="store_true",
                   help="with --suite: print the suite's plan and estimated time, run nothing")
    p.add_argument("--models", nargs="+", default=None,
                   help=f"models to time (default: {' '.join(DEFAULT_MODELS)}; with --suite, "
                        f"every suite model)")
    p.add_argument("--tokens", nargs="+", type=int, default=None,
                   help="tokens per GPU (default: each model's bench.tokens_per_gpu)")
    p.add_argument("--variants", nargs="+", default=["full", "ep64"], choices=["full", "ep64"])
    p.add_argument("--iters", type=int, default=None,
                   help="timed calls per measurement (default 10; 5 with --suite)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed calls before them (default 3; 2 with --suite)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--megakernel", action="store_true",
                   help="also time the megakernel path (kernel.forward_kernel and "
                        "backward_kernel: megakernel) and the forward megakernel with the "
                        "separate backward")
    p.add_argument("--mxfp8", action="store_true",
                   help="also time the mxfp8 recipe (path mok_mxfp8: the separate kernels)")
    p.add_argument("--mxfp8-megakernel", action="store_true",
                   help="also time the mxfp8 recipe on the forward megakernel (backward "
                        "separate; path mok_mxfp8_megakernel, one per --mxfp8-weights form) and "
                        "the BF16 forward megakernel it is measured against")
    p.add_argument("--mxfp8-megakernels", action="store_true",
                   help="also time the mxfp8 recipe on both megakernels (path "
                        "mok_mxfp8_megakernels, recomputed inputs; with --megakernel next to "
                        "BF16's both-megakernel path mok_megakernel)")
    p.add_argument("--mxfp8-weights", nargs="+", default=["auto"],
                   choices=["auto", "codes", "rounded"],
                   help="with --mxfp8: the kernel.mxfp8_weights forms to time, each its own "
                        "path (auto: mok_mxfp8, the recipe's default)")
    p.add_argument("--fp8-blockwise", action="store_true",
                   help="also time the fp8_blockwise recipe (path mok_fp8_blockwise: the "
                        "separate kernels on the FP8 grouped GEMM)")
    p.add_argument("--fp8-blockwise-megakernel", action="store_true",
                   help="also time the fp8_blockwise recipe on the forward megakernel (backward "
                        "separate; path mok_fp8_blockwise_megakernel) and the BF16 forward "
                        "megakernel it is measured against")
    p.add_argument("--fp8-blockwise-megakernels", action="store_true",
                   help="also time the fp8_blockwise recipe on both megakernels (path "
                        "mok_fp8_blockwise_megakernels, recomputed inputs; with --megakernel "
                        "next to BF16's both-megakernel path mok_megakernel)")
    p.add_argument("--comm-sms", type=int, default=16,
                   help="row-pulling blocks of the forward megakernel (kernel.comm_sms_forward)")
    p.add_argument("--comm-sms-backward", type=int, default=KernelKnobs.comm_sms_backward,
                   help="dY-pulling blocks of the backward megakernel (kernel.comm_sms_backward)")
    p.add_argument("--backward-inputs", default=None, choices=["saved", "recomputed"],
                   help="what the mok paths keep for backward (kernel.backward_inputs; default: "
                        "the recipe's)")
    p.add_argument("--macrobatch-tokens", type=int, default=KernelKnobs.macrobatch_tokens,
                   help="rows per macrobatch of the megakernel's ring (with --backward-inputs "
                        "recomputed)")
    p.add_argument("--kept-h", nargs="+", type=float, default=[],
                   help="also time the default kernels (auto) with saved inputs, recomputed, and "
                        "recomputed past h kept for each of these fractions of a rank's rows "
                        "(kernel.kept_h_tokens = fraction x tokens x topk), under "
                        "--kept-h-recipes")
    p.add_argument("--kept-h-recipes", nargs="+", default=["bf16"],
                   choices=["bf16", "mxfp8", "fp8_blockwise"],
                   help="the recipes --kept-h times (default: bf16)")
    p.add_argument("--streamed", action="store_true",
                   help="also time each path's calls issued back to back (the host running "
                        "ahead, as in training), next to the synchronized per-call times")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also time the mok paths' forward and forward + backward replayed from "
                        "a CUDA graph")
    p.add_argument("--recipe", nargs="+", default=[], choices=["bf16", "mxfp8", "fp8_blockwise"],
                   help="recipes timed next to bf16 (which always runs): mxfp8 is --mxfp8 (the "
                        "separate kernels), fp8_blockwise is --fp8-blockwise; with --suite, the "
                        "only recipes it runs (default: all)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for the results (default: none written; with --suite, "
                        "benchmarks/results/<card>-<date>/)")
    args = p.parse_args(argv)
    if args.dry_run and not args.suite:
        p.error("--dry-run goes with --suite")
    if any(not 0 < f <= 1 for f in args.kept_h):
        p.error(f"--kept-h fractions must be in (0, 1], got {args.kept_h}")
    if args.iters is None:
        args.iters = 5 if args.suite else 10
    if args.warmup is None:
        args.warmup = 2 if args.suite else 3
    if not args.suite:
        args.models = args.models or DEFAULT_MODELS
        args.backward_inputs = args.backward_inputs or KernelKnobs.backward_inputs
    args.mxfp8 = args.mxfp8 or "mxfp8" in args.recipe
    args.fp8_blockwise = args.fp8_blockwise or "fp8_blockwise" in args.recipe
    return args


def suite_module():
    """scripts/bench_suite.py. It imports this module by name; run as a script, this module is
    __main__, so it is registered under its name first instead of being imported twice."""
    sys.modules.setdefault("bench_moe", sys.modules[__name__])
    import bench_suite

    return bench_suite


def relaunch_under_torchrun(argv) -> None:
    """Started without torchrun: the same command again under torchrun, one process per
    visible GPU (EP = GPUs), NVLink multicast off; exits with its status. The command as typed
    goes along for the results' metadata."""
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise SystemExit("bench_moe.py needs a CUDA GPU (--suite --dry-run needs none)")
    env = {**os.environ, **MULTICAST_OFF, COMMAND_ENV: shlex.join(["python", sys.argv[0], *argv])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={gpus}", str(Path(__file__).resolve()), *argv]
    print(f"bench_moe.py: {gpus} GPU(s), running under torchrun: {shlex.join(cmd)}", flush=True)
    raise SystemExit(subprocess.call(cmd, env=env))


def command_line(world: int) -> str:
    """The command that started this run: as typed where the script relaunched itself under
    torchrun, else the torchrun command."""
    return os.environ.get(COMMAND_ENV) or shlex.join(
        ["torchrun", "--nproc-per-node", str(world), *sys.argv])


def git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True).stdout.strip()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.dry_run:
        suite_module().print_plan(args, world=max(1, torch.cuda.device_count()))
        return
    if "LOCAL_RANK" not in os.environ:
        relaunch_under_torchrun(argv)
    for var, val in MULTICAST_OFF.items():
        if os.environ.get(var) != val:
            raise SystemExit(f"set {var}={val}: NVLink multicast must stay off")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    from megatron.core import parallel_state

    world = dist.get_world_size()
    parallel_state.initialize_model_parallel(expert_model_parallel_size=world)
    group = parallel_state.get_expert_model_parallel_group()

    peaks = measure_peaks(world)
    log0(f"peaks: grouped GEMM {peaks['grouped_gemm_flops']/1e12:.0f} TFLOP/s, HBM "
         f"{peaks['hbm_bytes_per_s']/1e12:.2f} TB/s (read+write), peer copy "
         f"{peaks['nvlink_bytes_per_s']/1e9:.0f} GB/s one-way")
    others = optional_baselines()
    log0("baseline (b): Megatron MoEAlltoAllTokenDispatcher + torch._grouped_mm experts "
         "(Transformer Engine not used)")
    for name, status in others.items():
        log0(f"baseline {name}: {status}")

    if args.suite:
        suite_module().run(args, group, peaks, others)
    else:
        run_cases(args, group, peaks, others)
    dist.barrier()
    dist.destroy_process_group()


def run_cases(args, group, peaks, others):
    """The cases the flags ask for, each printed and written as it is measured."""
    world = dist.get_world_size()
    results = []
    for name in args.models:
        model = load_model(name)
        for variant in args.variants:
            for tokens in args.tokens or model.bench.tokens_per_gpu:
                r = run_case(model, variant, tokens, peaks, args, group)
                print_row(r)
                results.append(r)
                torch.cuda.empty_cache()
                write_results(args, results, peaks, others, world)


def write_results(args, results, peaks, others, world):
    """Rewritten after every case, so a run cut short keeps what it measured."""
    if dist.get_rank() == 0 and args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "gpu": torch.cuda.get_device_name(), "gpus": world, "commit": git_commit(),
                "torch": torch.__version__, "host": platform.node(),
                "command": command_line(world),
                "peaks": peaks, "baselines": others}
        (args.out / "results.json").write_text(json.dumps({"meta": meta, "results": results},
                                                          indent=1))
        chart(results, args.out / "chart.png")


if __name__ == "__main__":
    main()
