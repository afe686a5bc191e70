"""The multi-rank protocol on one GPU: EP=2 and EP=4 groups emulated in one process
(Workspace.emulated_group: one buffer per rank, one thread and stream per rank), for the
separate kernels and the forward megakernel - the schedule over every rank's routing, pulls
from and pushes to the other ranks' buffers, the barriers, the fixed-order combine. The same
checks as the torchrun tests (tests/dist), against the reference run on the whole problem,
and CUDA-graph replay; what only real GPUs test is NVLink itself (peer mappings,
system-scope ordering between GPUs)."""

import pytest

import gpu_checks

pytestmark = pytest.mark.gpu

MEGAKERNEL = {"forward_kernel": "megakernel", "comm_sms_forward": 8, "backward_inputs": "saved"}
RING = {**MEGAKERNEL, "backward_inputs": "recomputed", "macrobatch_tokens": 256}
SETTINGS = {"separate": {}, "megakernel": MEGAKERNEL, "ring": RING}
NAMES = [s.name for s in gpu_checks.ep_specs(2)]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
@pytest.mark.parametrize("world", [2, 4])
def test_matches_reference_and_is_deterministic(world, index, setting):
    spec = gpu_checks.ep_specs(world)[index]
    errors = gpu_checks.check_emulated_against_reference(spec, **SETTINGS[setting])
    print(f"EP={world}", spec.name, setting, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("world", [2, 4])
def test_megakernel_bit_identical_across_settings(world):
    """Comm blocks, minibatches, the ring and its macrobatch size change who does the work
    and when, never the bits."""
    spec = gpu_checks.ep_specs(world)[1]  # zipf
    gpu_checks.check_emulated_settings(spec, [
        MEGAKERNEL, {**MEGAKERNEL, "comm_sms_forward": 1},
        {**MEGAKERNEL, "comm_sms_forward": 32, "minibatch_tokens": 37},
        {**MEGAKERNEL, "minibatch_tokens": 1000}, RING, {**RING, "macrobatch_tokens": 128}])


@pytest.mark.parametrize("world", [2, 4])
def test_recomputed_backward_bit_identical_to_saved(world):
    spec = gpu_checks.ep_specs(world)[3]  # ragged, one rank without tokens
    gpu_checks.check_emulated_settings(spec, [{}, {"backward_inputs": "recomputed"}])


@pytest.mark.parametrize("world", [2, 4])
def test_kept_h_bit_identical_to_recomputing_all(world):
    """Each rank keeps h of its own schedule's first rows (the hot expert's rows span several
    m-blocks), with both forward kernels; the same bits as recomputing every row, and as EP=1."""
    spec = gpu_checks.ep_specs(world)[2]  # hot
    recomputed = {"backward_inputs": "recomputed", "kept_h_tokens": 384}
    gpu_checks.check_emulated_settings(spec, [{}, recomputed,
                                              {**recomputed, "forward_kernel": "megakernel"}])


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("world", [2, 4])
def test_cuda_graph_replay(world, setting):
    gpu_checks.check_emulated_cuda_graph(gpu_checks.ep_specs(world)[1], **SETTINGS[setting])


@pytest.mark.parametrize("setting", ["separate", "megakernel"])
@pytest.mark.parametrize("world", [2, 4])
def test_schedule_capacity_that_fits_changes_nothing(world, setting):
    """Uniform routing gives each rank ~1/EP of the worst case; 0.6 of it holds every row."""
    knobs = SETTINGS[setting]
    gpu_checks.check_emulated_settings(gpu_checks.ep_specs(world)[0],
                                       [knobs, {**knobs, "schedule_capacity": 0.6}])
