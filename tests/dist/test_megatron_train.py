"""Megatron's own training loop, 20 steps of a tiny GPT-MoE through scripts/pretrain_mok_gpt.py,
under ``mok`` and under ``alltoall`` (EP = the local GPUs, same seed): the loss curves agree
within bf16 noise. The CUDA kernels are used where the extension is built, the reference
backend otherwise.

    torchrun --nproc-per-node 2 -m pytest tests/dist/test_megatron_train.py

Rank 0 starts both trainings (each a torchrun over all local GPUs, see scripts/train_compare.py);
the other ranks only wait for it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.training")

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
STEPS = 20

pytestmark = pytest.mark.dist


def test_mok_trains_like_alltoall():
    if int(os.environ.get("RANK", "0")) != 0:
        pytest.skip("rank 0 runs both trainings on all local GPUs")
    # Not tmp_path: every rank's pytest owns the temporary root, and one that skips may clear
    # a shared --basetemp while rank 0 still writes there.
    out = Path(tempfile.mkdtemp(prefix="mok_train_compare_"))
    sys.path.insert(0, str(SCRIPTS))
    import train_compare

    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", torch.cuda.device_count()))
    backend = "auto" if importlib.util.find_spec("mok_megatron._C") else "reference"
    status = train_compare.main(["--nproc", str(nproc), "--steps", str(STEPS),
                                 "--backend", backend, "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    for dispatcher, curve in summary["curves"].items():
        assert len(curve) == STEPS and all(map(math.isfinite, curve)), dispatcher
        assert curve[-1] < curve[0], f"{dispatcher} did not learn: {curve}"
    assert status == 0, f"loss curves differ by {summary['max_relative_difference']}"
