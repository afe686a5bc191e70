"""Megatron's own training loop on one GPU, 100 steps of a tiny GPT-MoE through
scripts/pretrain_mok_gpt.py with ``mok`` under the bf16 recipe and an FP8 one (mxfp8,
fp8_blockwise; same seed, CUDA kernels): the FP8 loss stays within 2% of bf16's at every
logged step and both learn.

    python -m pytest tests/gpu/test_megatron_fp8_training.py -q -s
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("megatron.training")

pytestmark = pytest.mark.gpu

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
STEPS = 100


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_blockwise"])
def test_fp8_recipe_trains_like_bf16(recipe):
    out = Path(tempfile.mkdtemp(prefix=f"mok_{recipe}_training_"))
    sys.path.insert(0, str(SCRIPTS))
    import train_compare

    status = train_compare.main(["--nproc", "1", "--steps", str(STEPS), "--dispatchers", "mok",
                                 "--recipe", "bf16", recipe, "--backend", "cuda",
                                 "--rtol", "0.02", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    for name, curve in summary["curves"].items():
        assert len(curve) == STEPS and all(map(math.isfinite, curve)), name
        assert curve[-1] < curve[0], f"{name} did not learn: {curve}"
    print("max relative loss difference:", summary["max_relative_difference"])
    assert status == 0, f"loss curves differ by {summary['max_relative_difference']}"
