"""Test harness shared by the tests and the demo: an independent float64 oracle, random MoE
problems, and a runner that spawns one process per rank of an expert-parallel group.

The oracle is deliberately naive: a per-token, per-slot Python loop in float64, with the
activations written from their formulas. It shares no code with reference.py or
activations.py, so the two can only agree by both being right.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Accepted error of y and of every gradient, as relative L2 norm of (result - float64
# oracle). float64 differs from the oracle only in summation order. bf16 rounds h, act(h)*p,
# each expert output and y to 8 significant bits (unit roundoff 2**-8 = 3.9e-3); the
# reference lands at 3-5e-3 for y and for the gradients.
FP64_TOLERANCE = 1e-10
BF16_TOLERANCE = 1e-2

# ----------------------------------------------------------------------------- activations


def _silu(v: torch.Tensor) -> torch.Tensor:
    return v / (1 + torch.exp(-v))


def _gelu(v: torch.Tensor) -> torch.Tensor:
    return 0.5 * v * (1 + torch.erf(v / math.sqrt(2)))


def _relu(v: torch.Tensor) -> torch.Tensor:
    return v * (v > 0)


def _squared_relu(v: torch.Tensor) -> torch.Tensor:
    return _relu(v) ** 2


# Gated ones read FC1's output as [gate | up] and return act(gate) * up.
GATED_ACTIVATIONS = {"swiglu": _silu, "geglu": _gelu}
PLAIN_ACTIVATIONS = {"silu": _silu, "gelu": _gelu, "relu": _relu, "squared_relu": _squared_relu}
ACTIVATION_NAMES = sorted(GATED_ACTIVATIONS) + sorted(PLAIN_ACTIVATIONS)


def activate(name: str, h: torch.Tensor) -> torch.Tensor:
    if name in GATED_ACTIVATIONS:
        f = h.shape[-1] // 2
        return GATED_ACTIVATIONS[name](h[:f]) * h[f:]
    return PLAIN_ACTIVATIONS[name](h)


def fc1_rows(activation: str, ffn_hidden_size: int) -> int:
    return 2 * ffn_hidden_size if activation in GATED_ACTIVATIONS else ffn_hidden_size


# ------------------------------------------------------------------------------ the oracle


def moe_loop(
    x: torch.Tensor,
    ids: torch.Tensor,
    probs: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    activation: str,
    shared: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> torch.Tensor:
    """y[t] = sum_k W2[e] @ (act(W1[e] @ x[t]) * p[t, k]) over slots with e = ids[t, k] >= 0,
    plus W2s @ act(W1s @ x[t]) with a shared expert. Global weights [E, F1, H] / [E, H, F];
    float64 only; differentiable."""
    tensors = (x, probs, w1, w2) + tuple(shared or ())
    if any(t.dtype != torch.float64 for t in tensors):
        raise TypeError("the oracle computes in float64 only")
    rows = []
    for t in range(x.shape[0]):
        y_t = x.new_zeros(w2.shape[1])
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e < 0:
                continue
            a = activate(activation, w1[e] @ x[t]) * probs[t, k]
            y_t = y_t + w2[e] @ a
        if shared is not None:
            y_t = y_t + shared[1] @ activate(activation, shared[0] @ x[t])
        rows.append(y_t)
    return torch.stack(rows) if rows else x.new_zeros(0, w2.shape[1])


# ----------------------------------------------------------------------------- routings

ROUTINGS = ("uniform", "zipf", "hot", "no_last_expert")


def expert_popularity(kind: str, num_experts: int, generator: torch.Generator) -> torch.Tensor:
    """Relative chance of each expert to be picked (before the 'hot' expert is forced)."""
    if kind == "zipf":
        # Zipf, exponent 1.2: the most popular expert is picked ~2.3x as often as the second.
        rank = torch.randperm(num_experts, generator=generator).double() + 1
        return rank**-1.2
    weights = torch.ones(num_experts, dtype=torch.float64)
    if kind == "no_last_expert":
        weights[-1] = 0
    return weights


def random_routing(
    kind: str,
    num_tokens: int,
    num_experts: int,
    topk: int,
    generator: torch.Generator,
    probs_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, topk] (int64, distinct experts per token, random slot order) and probs [T, topk]
    (softmax of random logits). 'hot' sends every token to expert 0 in slot 0; the other
    slots pick uniformly among the remaining experts."""
    if kind not in ROUTINGS:
        raise ValueError(f"unknown routing {kind!r}; choose one of {ROUTINGS}")
    weights = expert_popularity(kind, num_experts, generator)
    if kind == "hot":
        weights[0] = 0
    picks = topk - 1 if kind == "hot" else topk
    if num_tokens > 0 and picks > 0:
        ids = torch.multinomial(weights.expand(num_tokens, -1).contiguous(), picks,
                                replacement=False, generator=generator)
    else:
        ids = torch.zeros(num_tokens, picks, dtype=torch.int64)
    if kind == "hot":
        ids = torch.cat([torch.zeros(num_tokens, 1, dtype=torch.int64), ids], dim=1)
    logits = torch.randn(num_tokens, topk, generator=generator, dtype=torch.float64)
    return ids, torch.softmax(logits, dim=1).to(probs_dtype)


def drop_slots(ids: torch.Tensor, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Mark a random ``fraction`` of the slots unused (-1)."""
    drop = torch.rand(ids.shape, generator=generator) < fraction
    return torch.where(drop, torch.full_like(ids, -1), ids)


# ------------------------------------------------------------------------------ problems


@dataclass(frozen=True)
class ProblemSpec:
    """One MoE layer call across an EP group, reproducible from its fields alone."""

    name: str
    tokens_per_rank: tuple[int, ...]
    num_experts: int = 8
    hidden: int = 32
    ffn: int = 16
    topk: int = 2
    activation: str = "swiglu"
    routing: str = "uniform"
    dtype: torch.dtype = torch.float64
    probs_dtype: Optional[torch.dtype] = None  # None: the dtype of x
    shared_expert: bool = False
    unused_fraction: float = 0.0
    seed: int = 0

    @property
    def world_size(self) -> int:
        return len(self.tokens_per_rank)

    @property
    def tolerance(self) -> float:
        """Accepted rel-L2 error of y and the gradients in this spec's dtype."""
        return FP64_TOLERANCE if self.dtype == torch.float64 else BF16_TOLERANCE

    def build(self) -> "MoEProblem":
        g = torch.Generator().manual_seed(self.seed)
        T, E, H = sum(self.tokens_per_rank), self.num_experts, self.hidden
        F1 = fc1_rows(self.activation, self.ffn)

        def randn(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(self.dtype)

        probs_dtype = self.probs_dtype or self.dtype
        ids, probs = random_routing(self.routing, T, E, self.topk, g, probs_dtype)
        if self.unused_fraction:
            ids = drop_slots(ids, self.unused_fraction, g)
        shared = None
        if self.shared_expert:
            shared = (randn(F1, H, scale=H**-0.5), randn(H, self.ffn, scale=self.ffn**-0.5))
        return MoEProblem(
            spec=self,
            x=randn(T, H),
            ids=ids,
            probs=probs,
            w1=randn(E, F1, H, scale=H**-0.5),
            w2=randn(E, H, self.ffn, scale=self.ffn**-0.5),
            shared=shared,
            dy=randn(T, H),
        )


@dataclass
class MoEProblem:
    """Global tensors of every rank: tokens concatenated in rank order, weights of all E
    experts (rank r holds experts [r*E/W, (r+1)*E/W)); dy is the gradient fed to y."""

    spec: ProblemSpec
    x: torch.Tensor
    ids: torch.Tensor
    probs: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    shared: Optional[tuple[torch.Tensor, torch.Tensor]]
    dy: torch.Tensor

    def local(self, rank: int, device: Optional[torch.device] = None) -> dict:
        """Rank ``rank``'s inputs, as fresh leaves (x, probs, w1, w2 require grad)."""
        counts = self.spec.tokens_per_rank
        start, stop = sum(counts[:rank]), sum(counts[: rank + 1])
        per_rank = self.spec.num_experts // self.spec.world_size
        experts = slice(rank * per_rank, (rank + 1) * per_rank)

        def leaf(t, grad=True):
            return t.clone().to(device).requires_grad_(grad)

        return {
            "x": leaf(self.x[start:stop]),
            "ids": leaf(self.ids[start:stop], grad=False),
            "probs": leaf(self.probs[start:stop]),
            "w1": leaf(self.w1[experts]),
            "w2": leaf(self.w2[experts]),
            "shared": None if self.shared is None else tuple(leaf(w, False) for w in self.shared),
            "dy": leaf(self.dy[start:stop], grad=False),
        }

    def oracle(self) -> dict[str, torch.Tensor]:
        """y and the gradients of sum(y * dy) from the float64 loop, over all ranks."""
        x, probs, w1, w2 = (t.double().requires_grad_() for t in
                            (self.x, self.probs, self.w1, self.w2))
        shared = None if self.shared is None else tuple(w.double() for w in self.shared)
        y = moe_loop(x, self.ids, probs, w1, w2, self.spec.activation, shared)
        if y.requires_grad:  # not when no token uses any expert
            (y * self.dy.double()).sum().backward()

        def grad(t):
            return torch.zeros_like(t) if t.grad is None else t.grad

        return {"y": y.detach(), "dx": grad(x), "dprobs": grad(probs), "dw1": grad(w1),
                "dw2": grad(w2)}


def expert_problem(n: int, hidden: int, ffn: int, seed: int):
    """One expert's bf16 problem for a quantized recipe's expert_mlp: x [n, H], gated W1
    [2F, H], W2 [H, F] (both scaled to unit output variance), probs [n] and dY [n, H], the
    first four requiring grad."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, hidden, generator=g).bfloat16().requires_grad_()
    w1 = (torch.randn(2 * ffn, hidden, generator=g) * hidden**-0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(hidden, ffn, generator=g) * ffn**-0.5).bfloat16().requires_grad_()
    p = torch.rand(n, generator=g).requires_grad_()
    do = torch.randn(n, hidden, generator=g).bfloat16()
    return x, w1, w2, p, do


def expert_grads(fn: Callable, x, w1, w2, p, do) -> dict[str, torch.Tensor]:
    """y = fn(x, w1, w2, p, "swiglu") and its gradients for dY = do."""
    for t in (x, w1, w2, p):
        t.grad = None
    y = fn(x, w1, w2, p, "swiglu")
    y.backward(do)
    return {"y": y.detach(), "dx": x.grad, "dw1": w1.grad, "dw2": w2.grad, "dprobs": p.grad}


def layer_outputs(y: torch.Tensor, inputs: dict) -> dict[str, torch.Tensor]:
    """y and the gradients backward left in `inputs` (zeros where none arrived), where they
    were computed."""
    def grad(name):
        g = inputs[name].grad
        return torch.zeros_like(inputs[name]) if g is None else g

    return {"y": y.detach(), "dx": grad("x"), "dprobs": grad("probs"), "dw1": grad("w1"),
            "dw2": grad("w2")}


def run_layer(layer: Callable[..., torch.Tensor], inputs: dict,
              cpu: bool = True) -> dict[str, torch.Tensor]:
    """y = layer(x, ids, probs, w1, w2), then y.backward(dy); outputs as CPU tensors (or
    where they were computed, with ``cpu=False``: no copy that waits for the device)."""
    y = layer(inputs["x"], inputs["ids"], inputs["probs"], inputs["w1"], inputs["w2"])
    y.backward(inputs["dy"].to(y.dtype))
    out = layer_outputs(y, inputs)
    return {name: t.cpu() for name, t in out.items()} if cpu else out


def concat_ranks(per_rank: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-rank outputs of run_layer -> global ones (tokens and experts in rank order)."""
    return {name: torch.cat([out[name] for out in per_rank]) for name in per_rank[0]}


def rel_l2(result: torch.Tensor, expected: torch.Tensor) -> float:
    """||result - expected|| / ||expected|| in float64 (the absolute norm where expected = 0)."""
    if result.shape != expected.shape:
        raise ValueError(f"shape {tuple(result.shape)} != expected {tuple(expected.shape)}")
    diff = (result.double() - expected.double()).norm()
    scale = expected.double().norm()
    return float(diff / scale) if scale > 0 else float(diff)


def compare(outputs: dict, expected: dict) -> dict[str, float]:
    return {name: rel_l2(outputs[name], expected[name]) for name in expected}


# ------------------------------------------------------------------------------- runner


def run_ranks(fn: Callable, world_size: int, *args, backend: str = "gloo",
              timeout_s: float = 120.0) -> list:
    """Run ``fn(rank, world_size, group, *args)`` in ``world_size`` spawned processes that form
    one process group (gloo on CPU; nccl with one GPU per rank). Returns each rank's result
    (anything torch.save can write). ``fn`` must be importable (a module-level function).
    A collective that waits longer than ``timeout_s`` fails instead of hanging."""
    with tempfile.TemporaryDirectory(prefix="mok_ranks_") as tmp:
        mp.spawn(_rank_main, args=(world_size, backend, tmp, timeout_s, fn, args),
                 nprocs=world_size, join=True)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world_size)]


def _rank_main(rank, world_size, backend, tmp, timeout_s, fn, args):
    device_id = None
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device_id = torch.device("cuda", rank)
    else:
        # All ranks are on this machine: talk over loopback, which works even where the
        # host name does not resolve (gloo's default is the host name's address).
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # Ranks share the machine's cores; more threads each would only oversubscribe them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group(backend, init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s),
                            device_id=device_id)
    try:
        result = fn(rank, world_size, dist.group.WORLD, *args)
        torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
