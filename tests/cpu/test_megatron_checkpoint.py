"""A checkpoint moves between ``alltoall`` and ``mok`` with no conversion: the same distributed-
checkpoint keys and shards, and a torch_dist round trip alltoall -> mok -> alltoall that keeps
every tensor bit-identical (EP=2 over gloo)."""

from __future__ import annotations

import pytest
import torch

import megatron_workers
from megatron_harness import run_distributed

pytest.importorskip("megatron.core")


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_ckpt")
    return run_distributed(2, megatron_workers.checkpoint_round_trip, str(root))


def test_sharded_state_dicts_are_the_same(round_trip):
    for rank, r in enumerate(round_trip):
        alltoall, mok = r["metadata"]["alltoall"], r["metadata"]["mok"]
        assert alltoall, f"rank {rank}: empty sharded state dict"
        assert alltoall == mok, f"rank {rank}"


def test_round_trip_is_bit_identical(round_trip):
    for rank, r in enumerate(round_trip):
        original = r["original"]
        for stage in ("mok", "back"):
            assert r[stage].keys() == original.keys(), f"rank {rank} {stage}"
            for name, tensor in original.items():
                assert torch.equal(r[stage][name], tensor), f"rank {rank} {stage}: {name}"
