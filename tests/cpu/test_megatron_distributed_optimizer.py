"""Training under Megatron's distributed optimizer with overlapped parameter all-gather and
gradient reduce-scatter: a GPTModel with two MoE layers, 4 gloo ranks as EP=2 x expert-data-
parallel 2, 3 steps under ``mok`` (reference backend), under ``mok`` with ``align_param_gather``
(the gathers are started ahead of the forward and only waited on in the modules' pre-hooks), and
under ``alltoall``, from the same initial weights and data.

With the distributed optimizer each replica updates only its shard of every bucket; the other
shards arrive through the all-gather that the forward pre-hooks wait on. Were the experts' hooks
skipped, each replica would compute with its own half-updated copy of the experts.
"""

from __future__ import annotations

import pytest
import torch

import megatron_training
from megatron_harness import run_distributed

pytest.importorskip("megatron.core")
WORLD_SIZE, EP, STEPS = 4, 2, 3
MOK, MOK_ALIGNED, ALLTOALL = ("mok", False), ("mok", True), ("alltoall", False)
VARIANTS = {"mok": MOK, "mok_aligned": MOK_ALIGNED, "alltoall": ALLTOALL}
# Relative L2 difference of the expert weights' change since the start, mok against alltoall.
# The parity test of one layer bounds bf16 gradients within 2e-2 of alltoall's; the update is
# about linear in the gradient here (see megatron_training.ADAM_EPS), and the weights are
# rounded to bf16 on top of it, so 3e-2. (Seen: 1.0e-2 to 1.6e-2. A replica computing with stale
# shards is off by ~0.7.)
UPDATE_RTOL = 3e-2
LOSS_RTOL = 1e-3


@pytest.fixture(scope="module")
def ranks():
    return run_distributed(WORLD_SIZE, megatron_training.train_variants, list(VARIANTS.values()),
                           STEPS, expert_model_parallel_size=EP)


def _flat(weights: dict) -> torch.Tensor:
    return torch.cat([w.float().flatten() for w in weights.values()])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_expert_weights_are_identical_on_every_replica(ranks, variant):
    results = [r[VARIANTS[variant]] for r in ranks]
    for rank, r in enumerate(results):
        for other in range(rank + 1, WORLD_SIZE):
            if results[other]["expert_rank"] != r["expert_rank"]:
                continue
            for step, (mine, theirs) in enumerate(zip(r["weights"], results[other]["weights"])):
                assert mine.keys() == theirs.keys()
                for name, weight in mine.items():
                    differ = int((weight != theirs[name]).sum())
                    assert differ == 0, (
                        f"{variant}: after {step} steps {name} differs on ranks {rank} and "
                        f"{other} (same experts) in {differ} of {weight.numel()} elements"
                    )


def test_replicas_are_compared(ranks):
    """Each EP rank has two replicas, the experts span several buckets, every step trained."""
    for variant in VARIANTS.values():
        results = [r[variant] for r in ranks]
        assert sorted((r["expert_rank"], r["expert_data_parallel_rank"]) for r in results) == [
            (0, 0), (0, 1), (1, 0), (1, 1)]
        for r in results:
            assert r["expert_bucket_groups"] >= 2
            assert len(r["weights"]) == STEPS + 1
            assert not torch.equal(_flat(r["weights"][0]), _flat(r["weights"][-1]))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_parameter_all_gather_is_waited_on(ranks, variant):
    for rank, r in enumerate(ranks):
        assert r[VARIANTS[variant]]["gathers_in_flight"] == [0] * (STEPS + 1), f"rank {rank}"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ddp_gradient_hooks_fire_for_every_expert_parameter(ranks, variant):
    for rank, r in enumerate(ranks):
        for fired, total in r[VARIANTS[variant]]["grad_hooks"]:
            assert total > 0 and fired == total, f"rank {rank}: {fired} of {total}"


@pytest.mark.parametrize("variant", ["mok", "mok_aligned"])
def test_mok_trains_like_alltoall(ranks, variant):
    for rank, r in enumerate(ranks):
        mok, ref = r[VARIANTS[variant]], r[ALLTOALL]
        start = _flat(ref["weights"][0])
        assert torch.equal(_flat(mok["weights"][0]), start), f"rank {rank}: different init"
        for step in range(1, STEPS + 1):
            update = _flat(ref["weights"][step]) - start
            error = (_flat(mok["weights"][step]) - start - update).norm() / update.norm()
            assert error <= UPDATE_RTOL, (
                f"{variant} rank {rank} after {step} steps: expert weight updates differ from "
                f"alltoall's by {error:.2e} (relative)"
            )
        for step, (loss, expected) in enumerate(zip(mok["losses"], ref["losses"])):
            torch.testing.assert_close(loss, expected, rtol=LOSS_RTOL, atol=0,
                                       msg=lambda m: f"{variant} rank {rank} step {step}: {m}")


def test_aligned_param_gather_trains_bitwise_like_overlapped(ranks):
    for rank, r in enumerate(ranks):
        aligned, overlapped = r[MOK_ALIGNED], r[MOK]
        for step, (a, b) in enumerate(zip(aligned["weights"], overlapped["weights"])):
            assert torch.equal(_flat(a), _flat(b)), f"rank {rank} after {step} steps"
        assert all(torch.equal(a, b) for a, b in zip(aligned["losses"], overlapped["losses"]))
