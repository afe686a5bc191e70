"""The README's main job (python -m mok_megatron.demo) passes on a CPU machine."""

import torch

from mok_megatron import demo


def test_demo_passes_on_cpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert demo.main(["--routing", "hot"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "gloo" in out


def test_demo_runs_the_mxfp8_recipe_on_cpu(capsys, monkeypatch):
    """`--recipe mxfp8` runs the reference's MXFP8 experts (mxfp8.py) and meets the recipe's
    bound against the float64 loop."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert demo.main(["--recipe", "mxfp8"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "mxfp8 experts" in out and "sum|d|/sum|ref|" in out
