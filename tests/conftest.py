"""Test selection by hardware (markers are declared in pyproject.toml): `gpu` tests skip
without a CUDA GPU, `dist` tests skip unless torchrun started several processes on GPUs.

The one-GPU suite emulates EP groups with one stream per rank, each rank's barrier waiting
for kernels on the others' streams. CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron's scripts export
it) puts all streams into one hardware queue, where such a barrier waits forever for a kernel
queued behind it. The driver reads the variable when it creates the CUDA context, so it is
removed here, before any test can create one; subprocesses the tests start inherit that.
"""

import os

DEVICE_MAX_CONNECTIONS = os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_report_header(config):
    if DEVICE_MAX_CONNECTIONS is not None:
        return (f"CUDA_DEVICE_MAX_CONNECTIONS={DEVICE_MAX_CONNECTIONS} removed for this run "
                "(emulated EP groups need concurrent streams)")
    return None


def pytest_collection_modifyitems(config, items):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_dist = pytest.mark.skip(reason="needs several CUDA GPUs under torchrun")
    for item in items:
        if "gpu" in item.keywords and gpus == 0:
            item.add_marker(skip_gpu)
        if "dist" in item.keywords and (gpus < 2 or world_size < 2):
            item.add_marker(skip_dist)
