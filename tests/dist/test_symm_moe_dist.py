"""The CUDA backend across GPUs: run under torchrun, one process per GPU, e.g.

    torchrun --nproc-per-node 2 -m pytest tests/dist/test_symm_moe_dist.py

Every rank runs the same tests in the same order (each call is a collective)."""

import os

import pytest
import torch
import torch.distributed as dist

import gpu_checks

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def group():
    if not dist.is_initialized():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    return dist.group.WORLD


def _spec(group, index: int):
    """Problem `index` of gpu_checks.ep_specs for this group's size."""
    return gpu_checks.ep_specs(dist.get_world_size(group))[index]


@pytest.mark.parametrize("index", range(6))
def test_matches_reference_and_is_deterministic(group, index):
    spec = _spec(group, index)
    errors = gpu_checks.check_against_reference(spec, dist.get_rank(group), group)
    print(spec.name, dist.get_rank(group), {k: f"{v:.2e}" for k, v in errors.items()})


def test_weight_lists_match_stacked(group):
    gpu_checks.check_weight_lists(_spec(group, 0), dist.get_rank(group), group)


def test_cuda_graph_replay(group):
    gpu_checks.check_cuda_graph(_spec(group, 1), dist.get_rank(group), group)


MEGAKERNEL = {"forward_kernel": "megakernel", "comm_sms_forward": 8}


@pytest.mark.parametrize("index", range(6))
def test_megakernel_matches_reference_and_is_deterministic(group, index):
    spec = _spec(group, index)
    errors = gpu_checks.check_against_reference(spec, dist.get_rank(group), group, **MEGAKERNEL)
    print("megakernel", spec.name, dist.get_rank(group), {k: f"{v:.2e}" for k, v in errors.items()})


def test_megakernel_bit_identical_across_comm_blocks(group):
    gpu_checks.check_megakernel_settings(_spec(group, 1),
                                         dist.get_rank(group), group)


def test_megakernel_cuda_graph_replay(group):
    gpu_checks.check_cuda_graph(_spec(group, 1), dist.get_rank(group),
                                group, **MEGAKERNEL)


@pytest.mark.parametrize("forward_kernel", ["separate", "megakernel"])
def test_recomputed_backward_bit_identical_to_saved(group, forward_kernel):
    spec = _spec(group, 3)  # ragged, one rank without tokens
    gpu_checks.check_recomputed_backward(spec, dist.get_rank(group), group,
                                         forward_kernel=forward_kernel)


def test_recomputed_backward_matches_reference(group):
    spec = _spec(group, 2)  # hot expert
    errors = gpu_checks.check_against_reference(spec, dist.get_rank(group), group,
                                                backward_inputs="recomputed",
                                                forward_kernel="megakernel")
    print("recomputed", spec.name, dist.get_rank(group),
          {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("backward_kernel", ["separate", "megakernel"])
def test_macrobatch_ring_bit_identical_to_no_ring(group, backward_kernel):
    """The rings over NVLink: forward's x rows and, with the backward megakernel, backward's
    x and dY rows pulled from peers macrobatch by macrobatch, weight gradients carried."""
    gpu_checks.check_macrobatch_ring(_spec(group, 2),  # hot expert
                                     dist.get_rank(group), group,
                                     backward_kernel=backward_kernel)


# Both megakernels (dY pulled and dX rows pushed over NVLink) and the FP8 recipes (the separate
# kernels, forward pulling FP8 wire rows from the peers; MXFP8 on the forward megakernel and on
# both, the backward one's ring at two m-blocks per macrobatch; blockwise on the forward
# megakernel, its pull keeping the peers' codes, and on both).
SETTINGS = {
    "megakernels": {**MEGAKERNEL, "backward_kernel": "megakernel", "comm_sms_backward": 8},
    "mxfp8": {"precision": "mxfp8"},
    "mxfp8_megakernel": {**MEGAKERNEL, "precision": "mxfp8", "backward_inputs": "recomputed"},
    "mxfp8_megakernels": {**MEGAKERNEL, "precision": "mxfp8", "backward_inputs": "recomputed",
                          "backward_kernel": "megakernel", "comm_sms_backward": 8,
                          "macrobatch_tokens": 256},
    "fp8_blockwise": {"precision": "fp8_blockwise"},
    "fp8_blockwise_megakernel": {**MEGAKERNEL, "precision": "fp8_blockwise",
                                 "backward_inputs": "recomputed"},
    "fp8_blockwise_megakernels": {**MEGAKERNEL, "precision": "fp8_blockwise",
                                  "backward_inputs": "recomputed", "backward_kernel": "megakernel",
                                  "comm_sms_backward": 8, "macrobatch_tokens": 256},
}


@pytest.mark.parametrize("index", range(6))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_megakernels_and_fp8_recipes_match_reference(group, setting, index):
    """Each setting against the reference of its precision, bit-identical reruns."""
    spec = _spec(group, index)
    errors = gpu_checks.check_against_reference(spec, dist.get_rank(group), group,
                                                **SETTINGS[setting])
    print(setting, spec.name, dist.get_rank(group), {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_megakernels_and_fp8_recipes_cuda_graph_replay(group, setting):
    gpu_checks.check_cuda_graph(_spec(group, 1), dist.get_rank(group), group, **SETTINGS[setting])
