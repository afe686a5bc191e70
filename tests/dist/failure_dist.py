"""Runs that must fail across GPUs, one process per GPU (test_failures_dist.py starts them, with
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; not under torchrun, which would
end the other ranks as soon as one fails, before they report):

    python tests/dist/failure_dist.py killed|stalled

Every rank first runs one forward + backward on the forward megakernel (the workspace and its
rendezvous exist, every rank passed every barrier), then:
killed   the last rank exits; the others call again and must stop at their first barrier,
         each with a TIMEOUT line naming the peer it waited for.
stalled  the last rank's forward megakernel starts with every block's arrival ticket past
         the row-pulling ones (tests/gpu/failure_cases.py's stall), so its FC1 tiles wait for
         rows nobody pulls: it stops with its own report, the others at the barrier after
         forward.
A rank that gets through its second call prints FINISHED (none may). A rank whose call fails
prints the error and the stall reports, then exits 1 at once: after a trap, the process
group's teardown could wait on the dead peers.
"""

from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import gpu_checks  # noqa: E402
from mok_megatron.cuda import ops, stall_watch  # noqa: E402

KNOBS = {"forward_kernel": "megakernel", "comm_sms_forward": 8, "spin_timeout_ms": 2000}


def main(case: str) -> None:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    spec = gpu_checks.ep_specs(world)[0]
    problem = spec.build()
    max_tokens = max(spec.tokens_per_rank)
    gpu_checks.run_cuda(problem, rank, group, max_tokens, **KNOBS)
    print(f"rank {rank}: first call done", flush=True)
    last = world - 1
    if rank == last and case == "killed":
        print(f"rank {rank}: exiting", flush=True)
        os._exit(0)
    if rank == last and case == "stalled":
        launch = ops.moe_forward_megakernel

        def stalled_launch(*args, **kw):
            kw["counters"][-1] = 1000  # the arrival counter: no block's ticket pulls rows
            return launch(*args, **kw)

        ops.moe_forward_megakernel = stalled_launch
        print(f"rank {rank}: its forward megakernel stalls", flush=True)
    try:
        gpu_checks.run_cuda(problem, rank, group, max_tokens, **KNOBS)
    except Exception as error:  # the trap, surfacing at the first call that synchronizes
        print(f"rank {rank}: failed: {error}", flush=True)
        stall_watch.tell_new_reports()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    print(f"rank {rank}: FINISHED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
