"""Test selection by hardware (markers are declared in pyproject.toml): `gpu` tests skip
without a CUDA GPU, `dist` tests skip unless torchrun started several processes on GPUs."""

import os

import pytest
import torch


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
