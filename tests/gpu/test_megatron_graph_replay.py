"""Megatron's own CUDA graphs around mok's fused call, on one GPU (EP=1, backend cuda).

A small GPT-MoE (Megatron's local no-TE spec, bf16, SwiGLU experts and a shared expert) is
wrapped in Megatron's DDP and trained for a few iterations by Megatron's forward_backward_func,
the way its training loop drives CUDA graphs: with --cuda-graph-impl local the first iteration
records eagerly and create_cudagraphs() (called by the schedule) warms up and captures each
graph's forward and backward; later iterations replay them. With full_iteration the
FullCudaGraphWrapper captures the whole forward-backward after its warm-up iterations. Each
iteration has new inputs and the weights are updated in place between iterations. The same
steps run eagerly on a copy of the model (and on a second copy, as a control of run-to-run
determinism); per-token losses and every parameter's main_grad must be bit-identical
(torch.equal). The graphs must have been captured and replayed (Megatron's graph state,
counted replays), and with whole-layer or full-iteration graphs mok's experts step must never
run in Python after capture, so the test cannot pass by running eagerly.

Each case runs in its own interpreter (Megatron's graph state, the mok workspace and the
model-parallel state are process-global):

    python -m pytest tests/gpu/test_megatron_graph_replay.py -q -s
    python tests/gpu/test_megatron_graph_replay.py [--case NAME]   # prints what it compares
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import subprocess
import sys
import tempfile
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
PASSED = "CUDA GRAPHS: ALL COMPARISONS BIT-IDENTICAL"

NUM_LAYERS = 2
HIDDEN = 256
HEADS = 4
EXPERTS = 8
TOPK = 2
FFN = 128  # per expert, and the shared expert's
VOCAB = 512
SEQ = 64
MICRO_BATCH = 2
MICROBATCHES = 2
ITERATIONS = 4
FULL_ITERATION_WARMUP = 1
LR = 1.0

# impl / modules: --cuda-graph-impl / --cuda-graph-modules; layer: the spec's layer class
# (GPT's TransformerLayer, or MoETransformerLayer whose 'moe_router' scope graphs the router
# and the postprocess and runs the experts step eagerly between them); knobs: recipe kernel.
CASES = {
    "local_whole_layer": dict(impl="local", modules=[], layer="TransformerLayer", knobs={}),
    "local_whole_layer_megakernel": dict(impl="local", modules=[], layer="TransformerLayer",
                                         knobs={"forward_kernel": "megakernel"}),
    "local_whole_layer_megakernels": dict(impl="local", modules=[], layer="TransformerLayer",
                                          knobs={"forward_kernel": "megakernel",
                                                 "backward_kernel": "megakernel"}),
    # Gradient-accumulation fusion: the backward (here the megakernel) adds the expert weight
    # gradients into DDP's fp32 main_grads in place (mok_megatron/cuda/main_grad.py). Also
    # compared with the unfused run of the same weights and batches (expert main_grads within
    # bf16 rounding, every other main_grad and the losses bit-identical).
    "local_whole_layer_megakernels_main_grad": dict(
        impl="local", modules=[], layer="TransformerLayer", grad_accum_fusion=True,
        knobs={"forward_kernel": "megakernel", "backward_kernel": "megakernel"}),
    # The same fusion on the separate backward (ops.grouped_wgrad_accumulate).
    "local_whole_layer_main_grad": dict(
        impl="local", modules=[], layer="TransformerLayer", grad_accum_fusion=True, knobs={}),
    # A TransformerLayer's manager wraps the whole layer under 'attn' too.
    "local_attn": dict(impl="local", modules=["attn"], layer="TransformerLayer", knobs={}),
    "local_moe_router": dict(impl="local", modules=["moe_router"], layer="MoETransformerLayer",
                             knobs={}),
    "full_iteration": dict(impl="full_iteration", modules=[], layer="TransformerLayer",
                           knobs={}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_recipe(knobs: dict) -> str:
    path = Path(tempfile.mkdtemp(prefix="mok_cuda_graphs_")) / "recipe.yaml"
    lines = ["backend: cuda\n"]
    # The separate kernels unless the case names a path.
    knobs = {"forward_kernel": "separate", "backward_kernel": "separate", **knobs}
    lines += ["kernel:\n"] + [f"  {k}: {v}\n" for k, v in knobs.items()]
    path.write_text("".join(lines))
    return str(path)


def _build_model(case: dict, graphed: bool):
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_submodules
    from megatron.core.transformer import transformer_layer
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=NUM_LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
        num_moe_experts=EXPERTS, moe_router_topk=TOPK, moe_ffn_hidden_size=FFN,
        moe_shared_expert_intermediate_size=FFN, moe_token_dispatcher_type="mok",
        moe_router_load_balancing_type="none", moe_router_dtype="fp32",
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        bf16=True, params_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0,
        # What the megatron-core wheel needs without Transformer Engine and Apex.
        persist_layer_norm=False, masked_softmax_fusion=False, bias_dropout_fusion=False,
        bias_activation_fusion=False, gradient_accumulation_fusion=False,
        cuda_graph_impl=case["impl"] if graphed else "none",
        cuda_graph_modules=list(case["modules"]),
        cuda_graph_warmup_steps=FULL_ITERATION_WARMUP if case["impl"] == "full_iteration" else 3,
    )
    spec = ModuleSpec(module=getattr(transformer_layer, case["layer"]),
                      submodules=get_gpt_layer_local_submodules(num_experts=EXPERTS,
                                                                moe_grouped_gemm=False))
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB,
                     max_sequence_length=SEQ, position_embedding_type="learned_absolute",
                     share_embeddings_and_output_weights=False).cuda()
    # Megatron's own linears read the flag when they are built (and would need Apex's fused
    # wgrad kernels); mok's dispatcher reads it at every call: set now, the experts alone fuse.
    model.config.gradient_accumulation_fusion = case.get("grad_accum_fusion", False)
    return model


def _batches(iteration: int) -> list[dict]:
    """The microbatches of one iteration, fresh tensors on every call (each model gets its own,
    so no graph metadata Megatron attaches to an input is shared between models)."""
    import torch

    g = torch.Generator().manual_seed(1000 + iteration)
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)
    batches = []
    for _ in range(MICROBATCHES):
        batches.append({
            "tokens": torch.randint(0, VOCAB, (MICRO_BATCH, SEQ), generator=g).cuda(),
            "labels": torch.randint(0, VOCAB, (MICRO_BATCH, SEQ), generator=g).cuda(),
            "position_ids": torch.arange(SEQ).repeat(MICRO_BATCH, 1).cuda(),
            "attention_mask": causal.repeat(MICRO_BATCH, 1, 1, 1).cuda(),
            "loss_mask": torch.ones(MICRO_BATCH, SEQ).cuda(),
        })
    return batches


class Trainer:
    """One model wrapped as Megatron's training wraps it (DDP around Float16Module), stepped
    by Megatron's forward_backward_func."""

    def __init__(self, model, impl: str):
        from megatron.core.distributed import (DistributedDataParallel,
                                               DistributedDataParallelConfig,
                                               finalize_model_grads)
        from megatron.core.full_cuda_graph import FullCudaGraphWrapper
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.transformer.module import Float16Module

        self.ddp = DistributedDataParallel(
            config=model.config, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True),
            module=Float16Module(model.config, model))
        model.config.no_sync_func = self.ddp.no_sync
        model.config.finalize_model_grads_func = finalize_model_grads
        forward_backward = get_forward_backward_func()
        if impl == "full_iteration":
            forward_backward = FullCudaGraphWrapper(
                forward_backward, cuda_graph_warmup_steps=FULL_ITERATION_WARMUP)
        self.forward_backward = forward_backward
        # Per-token losses land here by a copy inside the step, so a full-iteration replay
        # (which runs no Python) updates them too.
        self.losses = [None] * MICROBATCHES
        self.calls = 0

    def forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"],
                       labels=batch["labels"], loss_mask=batch["loss_mask"])
        slot = self.calls % MICROBATCHES
        self.calls += 1
        return output, functools.partial(self.loss_func, slot, batch["loss_mask"])

    def loss_func(self, slot: int, loss_mask, output):
        import torch

        if self.losses[slot] is None:  # the first iteration: eager in every case
            self.losses[slot] = torch.empty_like(output)
        self.losses[slot].copy_(output.detach())
        mask = loss_mask.view(-1).float()
        loss = torch.sum(output.view(-1).float() * mask)
        return loss, mask.sum().to(torch.int), {"lm loss": loss.detach()}

    def step(self, batches: list[dict]) -> dict:
        """One training iteration; returns the per-token losses and every main_grad, then
        updates the weights in place (graphs read the parameters where they are)."""
        import torch

        self.ddp.zero_grad_buffer()
        self.forward_backward(forward_step_func=self.forward_step, data_iterator=iter(batches),
                              model=[self.ddp], num_microbatches=MICROBATCHES, seq_length=SEQ,
                              micro_batch_size=MICRO_BATCH, forward_only=False)
        torch.cuda.synchronize()
        out = {f"loss[microbatch {k}]": t.clone() for k, t in enumerate(self.losses)}
        for name, param in self.ddp.module.named_parameters():
            out[f"main_grad[{name}]"] = param.main_grad.clone()
        with torch.no_grad():
            for param in self.ddp.module.parameters():
                param.add_(param.main_grad, alpha=-LR)
        return out


def _mismatches(expected: dict, got: dict) -> list[str]:
    import torch

    bad = []
    for name, want in expected.items():
        have = got[name]
        if not torch.equal(have, want):
            diff = (have.float() - want.float()).abs().max().item()
            bad.append(f"{name}: max |diff| {diff:.3e}")
    return bad


class Counters:
    """Replays of Megatron's local graph runners and of any CUDA graph, mok's experts step by
    whether it ran eagerly or inside a capture, and the launches that added expert weight
    gradients into main_grad: backward megakernels given the fp32 grads (one per layer call),
    the separate backward's ops.grouped_wgrad_accumulate (two per layer call: dW2, dW1)."""

    def __init__(self):
        import torch
        from megatron.core.transformer import cuda_graphs

        from mok_megatron.cuda import ops
        from mok_megatron.megatron.dispatcher import MokTokenDispatcher

        self.counts = {}
        self.reset()
        runner_replay = cuda_graphs._CudaGraphRunner.replay_graph_capture
        graph_replay = torch.cuda.CUDAGraph.replay
        experts_compute = MokTokenDispatcher.experts_compute
        backward_megakernel = ops.moe_backward_megakernel
        wgrad_accumulate = ops.grouped_wgrad_accumulate
        counts = self.counts

        def counted_runner_replay(runner, *args, **kwargs):
            counts["runner_replays"] += 1
            return runner_replay(runner, *args, **kwargs)

        def counted_graph_replay(graph):
            counts["graph_replays"] += 1
            return graph_replay(graph)

        def counted_experts_compute(dispatcher, *args, **kwargs):
            captured = torch.cuda.is_current_stream_capturing()
            counts["experts_captured" if captured else "experts_eager"] += 1
            return experts_compute(dispatcher, *args, **kwargs)

        cuda_graphs._CudaGraphRunner.replay_graph_capture = counted_runner_replay
        torch.cuda.CUDAGraph.replay = counted_graph_replay

        def counted_wgrad_accumulate(*args, **kwargs):
            counts["into_main_grad"] += 1
            return wgrad_accumulate(*args, **kwargs)

        def counted_backward_megakernel(*args, **kwargs):
            counts["into_main_grad"] += kwargs.get("dw1_fp32") is not None
            return backward_megakernel(*args, **kwargs)

        MokTokenDispatcher.experts_compute = counted_experts_compute
        ops.moe_backward_megakernel = counted_backward_megakernel
        ops.grouped_wgrad_accumulate = counted_wgrad_accumulate

    def reset(self):
        self.counts.update(runner_replays=0, graph_replays=0, experts_eager=0,
                           experts_captured=0, into_main_grad=0)


def _check_graph_state(case: dict, model, iteration: int, counts: dict) -> str:
    """Raise unless this iteration of the graphed model ran as its CUDA graphs should."""
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper
    from megatron.core.transformer import cuda_graphs

    calls = NUM_LAYERS * MICROBATCHES  # MoE layer calls per iteration
    replaying = iteration >= (FULL_ITERATION_WARMUP if case["impl"] == "full_iteration" else 1)
    if case["impl"] == "full_iteration":
        graph = FullCudaGraphWrapper.cuda_graph["training"]
        if iteration < FULL_ITERATION_WARMUP:
            expected = dict(graph_replays=0, experts_eager=calls, experts_captured=0)
        elif iteration == FULL_ITERATION_WARMUP:  # captured, then replayed, in this call
            expected = dict(graph_replays=1, experts_eager=0, experts_captured=calls)
        else:
            expected = dict(graph_replays=1, experts_eager=0, experts_captured=0)
        assert (graph is not None) == replaying, f"full-iteration graph: {graph}"
        got = {k: counts[k] for k in expected}
        assert got == expected, f"iteration {iteration}: expected {expected}, got {got}"
        return f"full-iteration graph {'replayed' if replaying else 'not yet captured'}, {got}"

    # The decoder layers' managers (with 'local' the GPT model holds one more, for MTP, idle here).
    managers = [m for name, m in model.named_modules()
                if isinstance(m, cuda_graphs.CudaGraphManager) and ".layers." in name]
    partial = case["layer"] == "MoETransformerLayer"
    per_layer = 2 if partial else 1  # router + postprocess graphs, or the whole layer
    assert len(managers) == per_layer * NUM_LAYERS, f"{len(managers)} CudaGraphManagers"
    if not replaying:
        # The schedule's create_cudagraphs() ran at the end of this first iteration.
        assert cuda_graphs._CudagraphGlobalRecord.cudagraph_created, "no CUDA graphs created"
        for manager in managers:
            assert len(manager.cudagraph_runners) == 1, len(manager.cudagraph_runners)
            runner = manager.cudagraph_runners[0]
            assert runner.fwd_graph is not None and runner.bwd_graph is not None
        expected = dict(runner_replays=0,
                        experts_captured=0 if partial else NUM_LAYERS)
    else:
        expected = dict(runner_replays=per_layer * calls,
                        graph_replays=2 * per_layer * calls,  # forward and backward
                        experts_eager=calls if partial else 0, experts_captured=0)
    got = {k: counts[k] for k in expected}
    assert got == expected, f"iteration {iteration}: expected {expected}, got {got}"
    what = "recorded and captured" if not replaying else "replayed"
    return f"{len(managers)} layer graphs {what}, {got}"


def _fused_against_unfused(fused: dict, unfused: dict) -> str:
    """One iteration's outputs with the fusion against those without it, from the same weights
    and batches: expert main_grads within fp32-vs-bf16 rounding, everything else bit-identical."""
    import torch

    worst = 0.0
    for name, have in fused.items():
        want = unfused[name]
        if ".mlp.experts." not in name:
            assert torch.equal(have, want), f"{name}: fused != unfused"
            continue
        # main_grad = 0 + dW of 2 microbatches: fp32 adds against bf16 gradients added.
        # An expert no token reached has zeros in both.
        if not want.any():
            assert not have.any(), f"{name}: fused adds to an expert without rows"
            continue
        err = float((have - want).norm() / want.norm())
        assert err < 1e-2, f"{name}: fused vs unfused rel-L2 {err:.2e}"
        worst = max(worst, err)
    return f"fused main_grads vs unfused: expert rel-L2 <= {worst:.1e}, the rest bit-identical"


def init_one_gpu_megatron(recipe_path: str, **seed_kwargs) -> None:
    """This process as a one-GPU Megatron job with mok registered and `recipe_path` as its
    recipe (MOK_RECIPE); seed_kwargs go to model_parallel_cuda_manual_seed."""
    for key, value in NO_MULTICAST.items():
        os.environ.setdefault(key, value)
    os.environ["MOK_RECIPE"] = recipe_path

    import torch
    import torch.distributed as dist

    # Megatron wraps a router helper in torch.compile; compiling it tests nothing of ours.
    torch._dynamo.config.disable = True
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from mok_megatron.megatron import register

    register()
    parallel_state.initialize_model_parallel()
    # Megatron initializes the router's weights on the CPU from the default generator
    # (moe/router.py: no GPU initialization yet), the rest from the CUDA tracker seeded below:
    # both seeded, a case's model and its routing are the same in every process (a number one
    # run reports, the next reproduces).
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234, **seed_kwargs)


def run_case(name: str) -> None:
    """One case in this process; raises on the first difference."""
    case = CASES[name]
    # CudaGraphManager needs a graph-safe RNG tracker (without Transformer Engine: this one).
    init_one_gpu_megatron(_write_recipe(case["knobs"]), use_cudagraphable_rng=True,
                          force_reset_rng=True)
    import torch

    counters = Counters()

    # The eager models first: building the first CudaGraphManager moves this thread to a side
    # stream (Megatron's capture needs the default stream untouched).
    eager_model = _build_model(case, graphed=False)
    control_model = _build_model(case, graphed=False)
    fused = case.get("grad_accum_fusion", False)
    unfused_model = _build_model({**case, "grad_accum_fusion": False}, False) if fused else None
    graphed_model = _build_model(case, graphed=True)
    for model in (control_model, graphed_model, unfused_model):
        if model is not None:
            model.load_state_dict(eager_model.state_dict())
    eager, control, graphed = (Trainer(m, impl) for m, impl in (
        (eager_model, "none"), (control_model, "none"), (graphed_model, case["impl"])))
    experts = graphed_model.decoder.layers[0].mlp.experts

    print(f"case {name}: --cuda-graph-impl {case['impl']} --cuda-graph-modules "
          f"{' '.join(case['modules']) or '(empty: whole layer)'}, {case['layer']}, recipe "
          f"backend cuda {case['knobs'] or '(default knobs)'}; {NUM_LAYERS} MoE layers, "
          f"{EXPERTS} experts top-{TOPK}, {MICROBATCHES} microbatches of {MICRO_BATCH}x{SEQ} "
          f"tokens, {ITERATIONS} iterations")
    unfused = Trainer(unfused_model, "none") if fused else None
    for iteration in range(ITERATIONS):
        if fused:  # the unfused model on the fused one's current weights, this iteration's data
            unfused_model.load_state_dict(eager_model.state_dict())
            counters.reset()
            plain = unfused.step(_batches(iteration))
            assert counters.counts["into_main_grad"] == 0, counters.counts
        counters.reset()
        want = eager.step(_batches(iteration))
        if fused:
            per_call = 1 if case["knobs"].get("backward_kernel") == "megakernel" else 2
            assert counters.counts["into_main_grad"] == per_call * NUM_LAYERS * MICROBATCHES, \
                counters.counts
        again = control.step(_batches(iteration))
        before = [p.detach().clone() for p in experts.parameters()]
        counters.reset()
        got = graphed.step(_batches(iteration))
        state = _check_graph_state(case, graphed_model, iteration, counters.counts)
        bad = _mismatches(want, again)
        assert not bad, ("two eager runs differ, so the graph comparison means nothing:\n  "
                         + "\n  ".join(bad))
        bad = _mismatches(want, got)
        assert not bad, f"iteration {iteration}: graphed != eager:\n  " + "\n  ".join(bad)
        assert any(not torch.equal(p, b) for p, b in zip(experts.parameters(), before)), \
            "the update changed no expert weight"
        if fused:
            state += "; " + _fused_against_unfused(want, plain)
        print(f"  iteration {iteration}: {state}; graphed == eager (torch.equal) for "
              f"{MICROBATCHES} per-token losses and {len(want) - MICROBATCHES} main_grads; "
              f"loss {want['loss[microbatch 0]'].mean().item():.4f}")
    print(PASSED)


def run_script_case(script: str, name: str) -> subprocess.CompletedProcess:
    """`python script --case name` in a fresh interpreter (Megatron's state, mok's workspace
    and the process group are per process)."""
    env = {**NO_MULTICAST, **os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, script, "--case", name], capture_output=True,
                          text=True, timeout=900, env=env, cwd=REPO)


def assert_case_passed(proc: subprocess.CompletedProcess, passed: str) -> None:
    print(proc.stdout)
    assert proc.returncode == 0 and passed in proc.stdout, (
        f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-8000:]}\n"
        f"--- stderr ---\n{proc.stderr[-8000:]}")


def exit_after_case(run, name: str):
    """Runs one case here, prints what failed, and leaves without interpreter and NCCL
    teardown (not under test): the exit status is the verdict."""
    status = 0
    try:
        run(name)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_case_in_subprocess(name: str) -> subprocess.CompletedProcess:
    return run_script_case(__file__, name)


# A case spends most of its ~12 s importing torch and Megatron and setting up NCCL on the CPU,
# and its verdict is its own process's: the cases' interpreters run this many at a time.
CONCURRENT_CASES = 4


class CaseRuns:
    """`python script --case NAME` for each of `names`, CONCURRENT_CASES at a time, all
    submitted at once; result(name) waits for that case's process."""

    def __init__(self, script: str, names: list[str]):
        self._pool = ThreadPoolExecutor(CONCURRENT_CASES)
        self._runs = {name: self._pool.submit(run_script_case, script, name) for name in names}

    def result(self, name: str) -> subprocess.CompletedProcess:
        return self._runs[name].result()

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def selected_cases(request, test) -> list[str]:
    """The `case` parameters of this session's items of `test` that will run: those -k or -m
    left, less those a skip or a true skipif marks."""
    def skipped(item) -> bool:
        return (item.get_closest_marker("skip") is not None
                or any(m.args and m.args[0] for m in item.iter_markers("skipif")))
    return [item.callspec.params["case"] for item in request.session.items
            if getattr(item, "function", None) is test and not skipped(item)]


@pytest.fixture(scope="module")
def case_runs(request):
    runs = CaseRuns(__file__, selected_cases(request, test_graph_replay_is_bit_identical_to_eager))
    yield runs
    runs.close()


# Refused by the support matrix where PyTorch lacks what its capture needs (the CPU tests check
# that refusal; tests/cpu/test_megatron_cuda_graphs.py).
FULL_ITERATION_CAPTURABLE = hasattr(torch.autograd.graph, "set_override_stale_capture_stream")


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=pytest.mark.skipif(
        name == "full_iteration" and not FULL_ITERATION_CAPTURABLE,
        reason="full_iteration needs torch.autograd.graph.set_override_stale_capture_stream; "
               "mok refuses it on this PyTorch"))
    for name in CASES])
def test_graph_replay_is_bit_identical_to_eager(case, case_runs):
    assert_case_passed(case_runs.result(case), PASSED)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=list(CASES),
                        help="run one case in this process (default: every case, each in a "
                             "fresh interpreter)")
    opts = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("skipped: needs a CUDA GPU")
        return 0
    if opts.case:
        exit_after_case(run_case, opts.case)
    failed = []
    for name in CASES:
        proc = run_case_in_subprocess(name)
        print(proc.stdout, end="")
        if proc.returncode != 0 or PASSED not in proc.stdout:
            failed.append(name)
            print(f"case {name} FAILED (exit {proc.returncode}):\n{proc.stderr[-8000:]}")
    print(f"{len(CASES) - len(failed)} of {len(CASES)} cases passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
