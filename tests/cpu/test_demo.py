"""The README's main job (python -m mok_megatron.demo) passes on a CPU machine."""

import torch

from mok_megatron import demo


def test_demo_passes_on_cpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert demo.main(["--routing", "hot"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "gloo" in out
