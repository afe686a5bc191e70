"""How the CUDA path stops across real GPUs when a rank dies or stalls: every other rank stops
within seconds with a report naming what it waited for, none hangs or finishes with wrong
output. Run under torchrun like the rest of tests/dist; rank 0 starts each case as one process
per local GPU (tests/dist/failure_dist.py) and reads each one's output, the other ranks only
wait.

    torchrun --nproc-per-node 2 -m pytest tests/dist/test_failures_dist.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("failure_dist.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_case(case: str):
    """-> (world, each rank's output, each rank's exit code, seconds until all had exited)."""
    if int(os.environ.get("RANK", "0")) != 0:
        pytest.skip("rank 0 runs the case on all local GPUs")
    sys.path.insert(0, str(ROOT / "scripts"))
    import train_compare

    world = int(os.environ.get("LOCAL_WORLD_SIZE", torch.cuda.device_count()))
    port = str(_free_port())
    start = time.monotonic()
    procs = []
    for rank in range(world):
        env = {**train_compare.launcher_env(), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, str(CASES), case], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    return world, outs, [p.returncode for p in procs], time.monotonic() - start


def test_killed_rank_stops_the_others_at_a_barrier():
    world, outs, codes, seconds = _run_case("killed")
    last = world - 1
    assert codes[last] == 0 and f"rank {last}: exiting" in outs[last], outs[last]
    for rank in range(last):
        out = outs[rank]
        assert codes[rank] != 0 and "FINISHED" not in out, out
        assert (f"mok_megatron: TIMEOUT rank {rank} stage" in out
                and f"for peer {last}" in out), out
    assert seconds < 180, seconds
    print(f"EP={world}: rank {last} killed, the others reported it; all exited in "
          f"{seconds:.0f} s")


def test_stalled_rank_is_named_and_the_others_stop():
    world, outs, codes, seconds = _run_case("stalled")
    last = world - 1
    for rank, out in enumerate(outs):
        assert codes[rank] != 0 and "FINISHED" not in out, out
        assert f"mok_megatron: TIMEOUT rank {rank}" in out, out
    assert f"mok_megatron: TIMEOUT rank {last}: a " in outs[last], outs[last]
    assert seconds < 180, seconds
    print(f"EP={world}: rank {last}'s megakernel stalled, every rank reported; all exited in "
          f"{seconds:.0f} s")
