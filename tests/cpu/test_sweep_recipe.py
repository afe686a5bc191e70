"""scripts/sweep_knobs.py writes a recipe that loads and carries the chosen knobs."""

import sys
from pathlib import Path

import pytest

from mok_megatron.config import CONFIG_DIR, load_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import sweep_knobs  # noqa: E402


def test_written_recipe_loads_with_chosen_knobs(tmp_path):
    out = tmp_path / "tuned.yaml"
    sweep_knobs.write_recipe(CONFIG_DIR / "recipes" / "bf16.yaml", out, 24)
    recipe = load_recipe(str(out))
    base = load_recipe("bf16")
    assert recipe.kernel.forward_kernel == "megakernel"
    assert recipe.kernel.comm_sms_forward == 24
    assert recipe.kernel.max_tokens_per_rank == base.kernel.max_tokens_per_rank
    # Only the two knob lines change, and every comment keeps its column.
    base_lines = (CONFIG_DIR / "recipes" / "bf16.yaml").read_text().splitlines()
    out_lines = out.read_text().splitlines()
    assert len(out_lines) == len(base_lines)
    changed = [o for o, b in zip(out_lines, base_lines) if o != b]
    assert [line.split(":")[0].strip() for line in changed] == ["comm_sms_forward",
                                                                "forward_kernel"]
    assert [o.find("#") for o in out_lines] == [b.find("#") for b in base_lines]


def test_written_recipe_with_ring_and_minibatch(tmp_path):
    out = tmp_path / "tuned.yaml"
    sweep_knobs.write_recipe(CONFIG_DIR / "recipes" / "bf16.yaml", out, 8, 4096, 256)
    recipe = load_recipe(str(out))
    assert (recipe.kernel.forward_kernel, recipe.kernel.comm_sms_forward,
            recipe.kernel.backward_inputs, recipe.kernel.macrobatch_tokens,
            recipe.kernel.minibatch_tokens) == ("megakernel", 8, "recomputed", 4096, 256)


def test_written_recipe_with_backward_megakernel(tmp_path):
    out = tmp_path / "tuned.yaml"
    sweep_knobs.write_recipe(CONFIG_DIR / "recipes" / "bf16.yaml", out, 12, None, 128, 24)
    recipe = load_recipe(str(out))
    assert (recipe.kernel.forward_kernel, recipe.kernel.backward_kernel,
            recipe.kernel.comm_sms_forward, recipe.kernel.comm_sms_backward) == (
                "megakernel", "megakernel", 12, 24)


def test_missing_knob_line_is_an_error(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("precision: bf16\n")
    with pytest.raises(ValueError, match="forward_kernel"):
        sweep_knobs.write_recipe(base, tmp_path / "out.yaml", 8)
