"""The reference MoE layer (the oracle of every backend) against the independent float64
per-token loop of mok_megatron.testing, at EP = 1 (in this process) and EP = 2 and 4 (gloo,
spawned processes; each world size spawns once and runs all its cases), plus gradcheck,
bitwise determinism, routing edge cases and input validation.
"""

from __future__ import annotations

import functools

import pytest
import torch
from dist_utils import global_view

from mok_megatron.functional import moe_experts
from mok_megatron.reference.moe import moe_reference
from mok_megatron.routing import topk_from_routing_map
from mok_megatron.testing import (
    ACTIVATION_NAMES,
    ProblemSpec,
    compare,
    concat_ranks,
    run_layer,
    run_ranks,
)

BF16 = dict(dtype=torch.bfloat16, probs_dtype=torch.float32)


def _specs(world: int, tokens: tuple[int, ...], zero_tokens: tuple[int, ...]) -> list:
    """Every activation in float64 (with and without a shared expert), bf16, and the edge
    cases, on ``world`` ranks with ragged token counts."""
    base = functools.partial(ProblemSpec, tokens_per_rank=tokens)
    specs = [
        base(f"ep{world}-{act}" + ("-shared" if i % 2 else ""), activation=act,
             shared_expert=bool(i % 2), seed=i)
        for i, act in enumerate(ACTIVATION_NAMES)
    ]
    specs += [
        base(f"ep{world}-bf16", **BF16),
        base(f"ep{world}-bf16-shared-zipf", routing="zipf", shared_expert=True, topk=3, **BF16),
        # Every token to expert 0: all other experts, and all other ranks, receive nothing.
        base(f"ep{world}-all-to-one-k1", routing="hot", topk=1),
        base(f"ep{world}-hot-k3", routing="hot", topk=3),
        base(f"ep{world}-k1-zipf", routing="zipf", topk=1),
        base(f"ep{world}-expert-without-tokens", routing="no_last_expert", topk=3),
        base(f"ep{world}-unused-slots", unused_fraction=0.3, topk=3),
        base(f"ep{world}-all-slots-unused", unused_fraction=1.0),
        ProblemSpec(f"ep{world}-rank-without-tokens", zero_tokens, routing="zipf"),
    ]
    return specs


SPECS = {
    1: _specs(1, (24,), (0,)),
    2: _specs(2, (24, 16), (20, 0)),
    4: _specs(4, (12, 0, 20, 7), (0, 9, 0, 14)),
}
DETERMINISM_SPEC = ProblemSpec("bitwise", (24, 16), routing="zipf", topk=3, shared_expert=True,
                               unused_fraction=0.2, **BF16)
GRADCHECK_SPEC = ProblemSpec("gradcheck", (3, 2), num_experts=4, hidden=4, ffn=2,
                             unused_fraction=0.2, seed=3)


def run_reference(spec: ProblemSpec, rank: int = 0, group=None) -> dict:
    inputs = spec.build().local(rank)
    layer = functools.partial(moe_reference, group=group, activation=spec.activation,
                              shared=inputs["shared"])
    return run_layer(layer, inputs)


def gradcheck_reference(spec: ProblemSpec, rank: int = 0, group=None) -> bool:
    """gradcheck of the layer as a function of global x, probs, w1, w2 (float64)."""
    problem = spec.build()
    ids = problem.local(rank)["ids"]

    def layer(x, probs, w1, w2):
        return moe_reference(x, ids, probs, w1, w2, group=group, activation=spec.activation)

    if group is not None:
        layer = global_view(layer, spec.tokens_per_rank, spec.num_experts, rank, group)
    inputs = [t.clone().requires_grad_() for t in (problem.x, problem.probs, problem.w1,
                                                   problem.w2)]
    return torch.autograd.gradcheck(layer, inputs)


def _ep_worker(rank, world, group, specs, extra_checks):
    results = {"cases": {spec.name: run_reference(spec, rank, group) for spec in specs}}
    if extra_checks:
        results["bitwise"] = [run_reference(DETERMINISM_SPEC, rank, group) for _ in range(2)]
        try:
            results["gradcheck"] = gradcheck_reference(GRADCHECK_SPEC, rank, group)
        except torch.autograd.gradcheck.GradcheckError as error:
            results["gradcheck"] = str(error)  # every rank fails the same way, in lockstep
    return results


@functools.cache
def _spawn_once(world: int):
    try:
        return run_ranks(_ep_worker, world, SPECS[world], world == 2, timeout_s=60)
    except Exception as error:  # kept, so that a failed spawn is not repeated by every test
        return error


def spawned(world: int) -> list[dict]:
    """Each rank's results of all EP=`world` checks, from one spawn of `world` processes."""
    result = _spawn_once(world)
    if isinstance(result, Exception):
        raise RuntimeError(f"the EP={world} processes failed") from result
    return result


def assert_matches_oracle(outputs: dict, spec: ProblemSpec) -> None:
    errors = compare(outputs, spec.build().oracle())
    over = {name: err for name, err in errors.items() if err > spec.tolerance}
    assert not over, f"{spec.name}: rel-L2 error over {spec.tolerance:g}: {over}; all: {errors}"


@pytest.mark.parametrize("spec", [s for specs in SPECS.values() for s in specs],
                         ids=lambda s: s.name)
def test_reference_matches_per_token_loop(spec):
    if spec.world_size == 1:
        outputs = run_reference(spec)
    else:
        outputs = concat_ranks([rank["cases"][spec.name] for rank in spawned(spec.world_size)])
    assert_matches_oracle(outputs, spec)


def test_oracle_check_can_fail():
    spec = SPECS[1][0]
    outputs = run_reference(spec)
    outputs["dw2"][0, 0, 0] += 1e-6
    with pytest.raises(AssertionError, match="dw2"):
        assert_matches_oracle(outputs, spec)


def test_gradcheck_ep1():
    spec = ProblemSpec("gradcheck-ep1", (5,), num_experts=4, hidden=4, ffn=2, topk=3,
                       unused_fraction=0.2, seed=1)
    assert gradcheck_reference(spec)


def test_gradcheck_ep1_shared_expert_geglu():
    problem = ProblemSpec("gradcheck-shared", (4,), num_experts=2, hidden=3, ffn=2,
                          activation="geglu", shared_expert=True, seed=2).build()
    leaves = [t.clone().requires_grad_() for t in
              (problem.x, problem.probs, problem.w1, problem.w2) + problem.shared]

    def layer(x, probs, w1, w2, ws1, ws2):
        return moe_reference(x, problem.ids, probs, w1, w2, activation="geglu",
                             shared=(ws1, ws2))

    assert torch.autograd.gradcheck(layer, leaves)


def test_gradcheck_ep2():
    assert all(rank["gradcheck"] is True for rank in spawned(2)), spawned(2)[0]["gradcheck"]


def _assert_bitwise_equal(first: dict, second: dict) -> None:
    for name in first:
        assert torch.equal(first[name], second[name]), f"{name} differs between two runs"


def test_bitwise_deterministic_ep1():
    spec = ProblemSpec("bitwise-ep1", (40,), routing="zipf", topk=3, shared_expert=True,
                       unused_fraction=0.2, **BF16)
    _assert_bitwise_equal(run_reference(spec), run_reference(spec))


def test_bitwise_deterministic_ep2():
    for rank in spawned(2):
        first, second = rank["bitwise"]
        assert first["y"].dtype == torch.bfloat16
        _assert_bitwise_equal(first, second)


# ------------------------------------------------------------------------ input validation


def _valid_inputs():
    inputs = ProblemSpec("errors", (6,), num_experts=4).build().local(0)
    return {name: inputs[name].detach() for name in ("x", "ids", "probs", "w1", "w2")}


def _with(name, fn):
    def mutate(inputs):
        inputs[name] = fn(inputs[name])
        return inputs

    return mutate


def _per_expert_lists(ragged):
    """w1 and w2 as per-expert lists; with `ragged`, expert 3's w1 one row short."""
    def mutate(inputs):
        inputs["w1"], inputs["w2"] = list(inputs["w1"]), list(inputs["w2"])
        if ragged:
            inputs["w1"][3] = inputs["w1"][3][:-1]
        return inputs

    return mutate


def _set(index, value):
    def fn(t):
        t = t.clone()
        t[index] = value
        return t

    return fn


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (_with("ids", _set((1, 0), 4)), ValueError,
         r"expert id 4 at token 1, slot 0 is out of range \[0, 4\)"),
        (_with("ids", _set((2, 1), -2)), ValueError, "expert id -2 at token 2, slot 1"),
        (_with("ids", lambda t: t.float()), TypeError, "expert ids must be int32 or int64"),
        (_with("probs", _set((3, 1), float("nan"))), ValueError,
         r"probs\[3, 1\] is nan: probs must be finite"),
        (_with("probs", lambda t: t[:, :1]), ValueError, "probs must have the shape of the"),
        (_with("probs", lambda t: t.long()), TypeError, "probs must be a floating-point"),
        (_with("x", lambda t: t[None]), ValueError, r"x must be \[T, H\]"),
        (_with("ids", lambda t: t[:5]), ValueError, r"expert ids must be \[T, K\] with T=6"),
        (_with("w1", lambda t: t[:, :-1]), ValueError, r"w1 must be \[E_local, 32, 32\]"),
        (_with("w2", lambda t: t[:, :-1]), ValueError, r"w2 must be \[E_local, 32, F\]"),
        (_with("w2", lambda t: t[:3]), ValueError, "w1 has 4 experts but w2 has 3"),
        (_with("w1", lambda t: t.float()), ValueError, "w1 is torch.float32 on cpu but x is"),
        (_with("ids", lambda t: t[:, 0]), ValueError, r"expert ids must be \[T, K\] with T=6"),
        (_with("ids", lambda t: t[:, :0]), ValueError, "at least one slot per token"),
        (_per_expert_lists(ragged=True), ValueError, r"w1\[3\] is \(31, 32\)"),
        (_with("w1", list), ValueError, "w1 and w2 must both be stacked tensors or both"),
        (_with("x", lambda t: t.numpy()), TypeError, "x must be a torch.Tensor"),
    ],
    ids=["id-too-large", "id-below-unused", "float-ids", "nan-probs", "probs-shape",
         "int-probs", "x-3d", "ids-rows", "w1-shape", "w2-shape", "expert-count", "w1-dtype",
         "ids-1d", "no-slots", "w1-list-ragged", "w1-list-w2-stacked", "x-not-tensor"],
)
def test_invalid_inputs_raise_clear_errors(mutate, error, match):
    inputs = mutate(_valid_inputs())
    with pytest.raises(error, match=match):
        moe_reference(**inputs)
    # The same message through the public API (reference backend on CPU).
    with pytest.raises(error, match=match):
        moe_experts(**mutate(_valid_inputs()))


def test_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        moe_reference(**_valid_inputs(), activation="tanh")


# -------------------------------------------------------------- Megatron routing converter


def test_topk_from_routing_map():
    routing_map = torch.tensor([
        [0, 1, 0, 1, 0, 0],
        [1, 0, 0, 0, 0, 1],
        [0, 0, 0, 0, 1, 0],  # fewer experts than slots: trailing slot unused
        [0, 0, 0, 0, 0, 0],  # no expert at all
        [0, 0, 1, 0, 0, 1],
    ], dtype=torch.bool)
    dense = torch.rand(routing_map.shape, generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64).requires_grad_()
    ids, probs = topk_from_routing_map(routing_map, dense, topk=2)

    assert ids.tolist() == [[1, 3], [0, 5], [4, -1], [-1, -1], [2, 5]]
    expected = [[dense[t, e].item() if e >= 0 else 0.0 for e in row]
                for t, row in enumerate(ids.tolist())]
    assert probs.tolist() == expected

    weight = torch.arange(1.0, 11.0, dtype=torch.float64).view(5, 2)
    (probs * weight).sum().backward()
    expected_grad = torch.zeros_like(dense)
    for t, row in enumerate(ids.tolist()):
        for k, e in enumerate(row):
            if e >= 0:
                expected_grad[t, e] = weight[t, k]
    assert torch.equal(dense.grad, expected_grad)


@pytest.mark.parametrize(
    "routing_map, topk, error, match",
    [
        (torch.ones(3, 4), 2, TypeError, "routing_map must be torch.bool"),
        (torch.ones(3, 5, dtype=torch.bool), 2, ValueError, r"must both be \[T, E\]"),
        (torch.ones(3, 4, dtype=torch.bool), 5, ValueError, r"topk must be in \[1, 4\]"),
    ],
    ids=["float-map", "shape", "topk"],
)
def test_topk_from_routing_map_errors(routing_map, topk, error, match):
    with pytest.raises(error, match=match):
        topk_from_routing_map(routing_map, torch.rand(3, 4), topk)


def test_routing_map_with_more_than_topk_experts_is_refused():
    """A map padded to expert capacity (every expert selected) must not be truncated to the
    first top-k expert ids, whose probabilities are 0 there: the token's real experts (5 and 7)
    would vanish and its output be zero. Named by token, on the host (the reference backend's
    check; the CUDA backend's is a kernel: tests/gpu/test_failures.py)."""
    routing_map = torch.zeros(4, 8, dtype=torch.bool)
    routing_map[:, [1, 6]] = True
    routing_map[2] = True
    probs = torch.zeros(4, 8)
    probs[2, 5], probs[2, 7] = 0.6, 0.4
    with pytest.raises(ValueError, match="token 2 selects 8 experts, more than "
                                         "moe_router_topk = 2"):
        topk_from_routing_map(routing_map, probs, topk=2)
