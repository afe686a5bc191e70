"""Runs that must fail, each in a process of its own (a device trap ends the CUDA context):

    python tests/gpu/failure_cases.py bad_id KERNEL WORLD BAD_RANK ID DTYPE
    python tests/gpu/failure_cases.py stall WORLD STALLED_RANK
    python tests/gpu/failure_cases.py padded_routing_map

bad_id: expert id ID (as DTYPE, int32 or int64) planted at token 3, slot 1 of rank BAD_RANK,
forward + backward through the CUDA path (KERNEL: separate or megakernel) at EP=WORLD
(emulated on one GPU when WORLD > 1). stall: rank STALLED_RANK's (>= 1: rank 0 runs the EP=1 warm-up) forward megakernel starts
with every block's arrival ticket past the row-pulling ones, so its FC1 tiles wait for rows
nobody pulls. padded_routing_map: Megatron's routing map with every expert selected for token
2 (expert padding to capacity), converted for the CUDA backend (routing.py, on the device).
Each prints what it ran to stdout; test_failures.py reads the reports.
"""

from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import torch  # noqa: E402

import gpu_checks  # noqa: E402
from mok_megatron.cuda import ops  # noqa: E402

BAD_TOKEN, BAD_SLOT = 3, 1
MEGAKERNEL = {"forward_kernel": "megakernel", "comm_sms_forward": 8, "backward_inputs": "saved"}


def bad_id(kernel: str, world: int, bad_rank: int, bad: int, dtype: str) -> None:
    spec = gpu_checks.ep_spec("bad_id", world, tokens=tuple(64 for _ in range(world)))
    problem = spec.build()
    problem.ids = problem.ids.to(getattr(torch, dtype))
    problem.ids[bad_rank * 64 + BAD_TOKEN, BAD_SLOT] = bad
    knobs = MEGAKERNEL if kernel == "megakernel" else {}
    print(f"running {kernel} EP={world} with id {bad} at rank {bad_rank}", flush=True)
    if world == 1:
        gpu_checks.run_cuda(problem, 0, None, 64, **knobs)
    else:
        gpu_checks.run_emulated(problem, 64, **knobs)
    print("FINISHED without an error", flush=True)


def stall(world: int, stalled_rank: int) -> None:
    spec = gpu_checks.ep_spec("stall", world)
    launch = ops.moe_forward_megakernel

    def stalled_launch(*args, rank: int = 0, **kw):
        if rank == stalled_rank:
            counters = kw["counters"]  # megakernel_path passes the launch's buffers by name
            counters[-1] = 1000  # the arrival counter: no block's ticket makes it a puller
            # Its bound a quarter of the others': its trap comes first, before the other
            # ranks' waits for it (a barrier's 2 s) end the process with their own report.
            kw["timeout_ns"] //= 4
        return launch(*args, rank=rank, **kw)

    ops.moe_forward_megakernel = stalled_launch
    print(f"running EP={world} with rank {stalled_rank}'s megakernel stalled", flush=True)
    gpu_checks.run_emulated(spec.build(), max(spec.tokens_per_rank),
                            spin_timeout_ms=2000, **MEGAKERNEL)
    print("FINISHED without an error", flush=True)


def padded_routing_map() -> None:
    from mok_megatron.routing import topk_from_routing_map

    routing_map = torch.zeros(64, 8, dtype=torch.bool, device="cuda")
    routing_map[:, [1, 6]] = True
    routing_map[2] = True
    probs = torch.rand(64, 8, device="cuda") * routing_map
    print("running a routing map with 8 experts for token 2, top-2", flush=True)
    ids, _ = topk_from_routing_map(routing_map, probs, 2, on_device=True, rank=3)
    torch.cuda.synchronize()
    print(f"FINISHED without an error: ids of token 2 {ids[2].tolist()}", flush=True)


if __name__ == "__main__":
    case, *args = sys.argv[1:]
    if case == "bad_id":
        bad_id(args[0], int(args[1]), int(args[2]), int(args[3]), args[4])
    elif case == "padded_routing_map":
        padded_routing_map()
    else:
        stall(int(args[0]), int(args[1]))
