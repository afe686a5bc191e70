"""The forward megakernel (kernel.forward_kernel: megakernel) on one GPU (EP=1): the v1 checks
(reference agreement on uniform, skewed and adversarial routings, poisoned outputs, bitwise
reruns, CUDA graphs), plus bit-identical results across numbers of row-pulling blocks and
minibatch sizes, and with the macrobatch ring at several macrobatch sizes."""

import pytest

import gpu_checks
from test_symm_moe import SPECS

pytestmark = pytest.mark.gpu

MEGAKERNEL = {"forward_kernel": "megakernel", "comm_sms_forward": 8}
# The ring runs with recomputed backward inputs; 256-row macrobatches make it wrap many times.
RING = {**MEGAKERNEL, "backward_inputs": "recomputed", "macrobatch_tokens": 256}
SETTINGS = {"plain": MEGAKERNEL, "ring": RING}


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_matches_reference_and_is_deterministic(spec, setting):
    errors = gpu_checks.check_against_reference(spec, 0, None, **SETTINGS[setting])
    print(spec.name, setting, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("spec", SPECS[:3], ids=lambda s: s.name)
def test_bit_identical_across_comm_blocks_and_minibatches(spec):
    gpu_checks.check_megakernel_settings(spec, 0, None)


@pytest.mark.parametrize("spec", SPECS[:3], ids=lambda s: s.name)
def test_ring_bit_identical_to_no_ring(spec):
    gpu_checks.check_macrobatch_ring(spec, 0, None)


@pytest.mark.parametrize("setting", SETTINGS)
def test_cuda_graph_replay(setting):
    gpu_checks.check_cuda_graph(SPECS[1], 0, None, **SETTINGS[setting])
