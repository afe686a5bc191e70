"""How the CUDA path stops when it must: a bad expert id, a stalled rank, an environment that
serializes streams - each with a message naming where, never a silent wrong result or a bare
CUDA error. Each bad run is a subprocess (failure_cases.py): a device trap ends its context."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("failure_cases.py")
INT32_MAX = 2**31 - 1

# (world, bad rank, planted id, its dtype, the id the report shows, experts E): ids at and past
# E, below -1, and int64 ids beyond int32 (which must not wrap into a valid expert: 2^32 + 1
# would read as expert 1).
BAD_IDS = [
    (1, 0, 4, "int32", 4),
    (1, 0, -2, "int32", -2),
    (1, 0, 2**32 + 1, "int64", INT32_MAX),
    (2, 1, 8, "int32", 8),
    (2, 1, -(2**40), "int64", -(2**31)),
]


def _run(*args, timeout=240, env=None):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("kernel", ["separate", "megakernel"])
@pytest.mark.parametrize("world,rank,bad,dtype,shown", BAD_IDS,
                         ids=[f"ep{w}_rank{r}_{b}_{d}" for w, r, b, d, _ in BAD_IDS])
def test_bad_expert_id_stops_with_its_place(kernel, world, rank, bad, dtype, shown):
    """The schedule kernel reads every id on the GPU and stops every rank with a report of the
    first bad one: source rank, token, slot, id - no host sync, no finite wrong output."""
    proc, _ = _run(CASES, "bad_id", kernel, world, rank, bad, dtype)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "FINISHED" not in proc.stdout, out
    expected = (f"BAD EXPERT ID (seen by rank {{}}): source rank {rank}, token 3, slot 1 has "
                f"expert id {shown}")
    assert any(expected.format(r) in out for r in range(world)), out
    assert f"outside [0, {4 * world})" in out, out


def test_routing_map_with_more_than_topk_experts_stops_with_its_token():
    """A routing map padded to expert capacity, converted for the CUDA backend: a kernel counts
    each token's experts and stops with a report naming the token and the EP rank, with no
    host sync - never the first top-k expert ids with zero probabilities."""
    proc, _ = _run(CASES, "padded_routing_map")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "FINISHED" not in proc.stdout, out
    assert ("ROUTING MAP (rank 3): token 2 selects 8 experts, more than moe_router_topk = 2"
            in out), out


def test_stalled_rank_in_megakernel_is_named():
    """Rank 1's megakernel waits for rows nobody pulls: its bounded wait traps after its bound
    (a quarter of the recipe's 2 s: failure_cases.stall, so that it comes before rank 0's wait
    for rank 1 ends), and the user reads which rank, kernel, role, tile and stage - not only
    'unspecified launch failure'. Well within a minute."""
    proc, seconds = _run(CASES, "stall", 2, 1)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "FINISHED" not in proc.stdout, out
    assert "mok_megatron: TIMEOUT rank 1: a " in proc.stderr, out
    assert "wait of the forward megakernel gave up after 500 ms" in proc.stderr, out
    roles = ("rows ready", "gemm mma", "tile queue", "fc1 done", "staging")
    assert any(f"a '{r}' wait" in proc.stderr for r in roles), out
    assert seconds < 60, f"the stall took {seconds:.0f} s to be reported"


def test_emulated_groups_run_with_device_max_connections_1():
    """Megatron's scripts export CUDA_DEVICE_MAX_CONNECTIONS=1, which serializes streams; the
    suite's conftest removes it before any CUDA context exists, so an emulated EP test that
    would deadlock in its first barrier passes."""
    env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    proc, _ = _run("-m", "pytest", "-p", "no:cacheprovider",
                   "tests/gpu/test_emulated_ep.py::test_matches_reference_and_is_deterministic"
                   "[2-uniform-separate]", "tests/gpu/test_emulated_ep.py::"
                   "test_matches_reference_and_is_deterministic[2-uniform-megakernel]",
                   env=env, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "2 passed" in proc.stdout, out
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1 removed" in proc.stdout, out  # pytest's header
