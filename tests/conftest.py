"""Test selection by hardware (markers are declared in pyproject.toml): `gpu` tests skip
without a CUDA GPU, `dist` tests skip unless torchrun started several processes on GPUs;
`slow` tests (minutes each) skip unless a -m expression names them (`-m slow`), so the default
GPU run fits one sitting and the long runs go separately.

The one-GPU suite emulates EP groups with one stream per rank, each rank's barrier waiting
for kernels on the others' streams. CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron's scripts export
it) puts all streams into one hardware queue, where such a barrier waits forever for a kernel
queued behind it. The driver reads the variable when it creates the CUDA context, so it is
removed here, before any test can create one; subprocesses the tests start inherit that.

With MOK_EXPECT_MEGATRON=X.Y.Z (.ci/run sets it for each megatron-core it tests), the run
prints which megatron-core it imports, and from where, and stops before any test when that is
not X.Y.Z: a run against another version than intended cannot pass.
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


EXPECT_MEGATRON = "MOK_EXPECT_MEGATRON"


def pytest_sessionstart(session):
    expected = os.environ.get(EXPECT_MEGATRON)
    if not expected:
        return
    import megatron.core

    # __version__ carries a git hash when the package lies inside a git checkout.
    found = megatron.core.__shortversion__
    where = os.path.dirname(megatron.core.__file__)
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    terminal.write_line(f"megatron-core {found} from {where} ({EXPECT_MEGATRON}={expected})")
    if found != expected:
        raise pytest.UsageError(
            f"{EXPECT_MEGATRON}={expected}, but these tests import megatron-core {found} from "
            f"{where}; put megatron-core {expected} first on PYTHONPATH, or unset {EXPECT_MEGATRON}"
        )


def pytest_collection_modifyitems(config, items):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_dist = pytest.mark.skip(reason="needs several CUDA GPUs under torchrun")
    skip_slow = pytest.mark.skip(reason="slow: select it with -m slow")
    run_slow = "slow" in (config.option.markexpr or "")
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and gpus == 0:
            item.add_marker(skip_gpu)
        if "dist" in item.keywords and (gpus < 2 or world_size < 2):
            item.add_marker(skip_dist)
