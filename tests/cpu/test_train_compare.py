"""scripts/train_compare.py's reading of Megatron's training log: the loss and the throughput
of every logged iteration, from lines in the format megatron/training/training.py's
training_log writes (what scripts/multi_gpu_check.sh's training step reports side by side)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import train_compare  # noqa: E402


def _line(iteration: int, iterations: int, ms: float, batch: int, loss: float) -> str:
    """One iteration's log line, built as training_log builds it (megatron-core 0.19)."""
    s = " [2026-12-05 00:00:00.000000]"
    s += " iteration {:8d}/{:8d} |".format(iteration, iterations)
    s += " consumed samples: {:12d} |".format(iteration * batch)
    s += " elapsed time per iteration (ms): {:.1f} |".format(ms)
    s += f" learning rate: {1e-3:.6E} |"
    s += f" global batch size: {batch:5d} |"
    s += " {}: {:.6E} |".format("lm loss", loss)
    s += f" loss scale: {1.0:.1f} |"
    return s


def test_throughput_is_the_median_after_warmup():
    times = [900.0, 400.0, 300.0, 60.0, 55.0, 70.0, 58.0, 57.0]
    log = "\n".join(["building GPT model ..."]
                    + [_line(i + 1, len(times), ms, 8, 7.0 - 0.1 * i)
                       for i, ms in enumerate(times)])
    rate = train_compare.tokens_per_second(log, seq_length=64)
    assert rate == pytest.approx(8 * 64 / 0.058)  # median of 60, 55, 70, 58, 57 ms
    losses = train_compare.ITERATION_LOSS.findall(log)
    assert [int(i) for i, _ in losses] == list(range(1, len(times) + 1))
    assert float(losses[-1][1]) == pytest.approx(6.3)


def test_throughput_of_a_short_run_uses_every_iteration():
    log = "\n".join(_line(i, 2, ms, 4, 7.0) for i, ms in ((1, 100.0), (2, 300.0)))
    assert train_compare.tokens_per_second(log, seq_length=32) == pytest.approx(
        (4 * 32 / 0.1 + 4 * 32 / 0.3) / 2)


def test_throughput_without_iteration_times_is_nan():
    assert math.isnan(train_compare.tokens_per_second("no iterations logged", seq_length=64))
