"""megatron_harness.run_distributed repeats a run once when a rank segfaulted inside a
torch.distributed collective (crashed_in_c10d: its innermost Python frame in
torch/distributed/distributed_c10d.py - gloo's coalesced collectives, seen three times in CI,
never reproduced; docs/megatron.md) - and only then: any other crash, or that one twice,
fails. The crashes here are real segfaults in the spawned rank, in code whose frames read as
c10d's or not."""

import ctypes
import os
import textwrap

import pytest

pytest.importorskip("megatron.core")

from megatron_harness import crashed_in_c10d, run_distributed  # noqa: E402

# Compiled under c10d's path, so that a fault dump lists its frame as torch's. The segfault is
# a C call (ctypes.memmove through its function pointer: no Python frame of its own).
_C10D_SOURCE = textwrap.dedent("""
    def wait(marker, once):
        if once and os.path.exists(marker):
            return "ran"
        open(marker, "w").close()
        ctypes.memmove(8, 16, 8)
""")
_as_c10d = {"os": os, "ctypes": ctypes}
exec(compile(_C10D_SOURCE, os.path.join("/site-packages", "torch", "distributed",
                                        "distributed_c10d.py"), "exec"), _as_c10d)


def crash_once_in_c10d(marker: str):
    return _as_c10d["wait"](marker, True)


def crash_always_in_c10d(marker: str):
    _as_c10d["wait"](marker, False)


def crash_once_elsewhere(marker: str):
    """As crash_once_in_c10d, from this file: a rerun would return."""
    if os.path.exists(marker):
        return "ran"
    open(marker, "w").close()
    ctypes.memmove(8, 16, 8)


def test_crash_in_a_collective_runs_again_once(tmp_path):
    assert run_distributed(1, crash_once_in_c10d, str(tmp_path / "marker")) == ["ran"]


@pytest.mark.parametrize("fn", [crash_always_in_c10d, crash_once_elsewhere])
def test_other_crashes_fail(tmp_path, fn):
    """A second crash in c10d fails; a crash elsewhere fails at once (its rerun would pass)."""
    with pytest.raises(RuntimeError, match="SIGSEGV"):
        run_distributed(1, fn, str(tmp_path / "marker"))


def test_the_dumps_ci_saw_are_recognised():
    """Dumps shaped as the CI crashes' match: the parameter all-gather's innermost frame as
    a CI run printed it on 2026-12-05 (c10d line 2696, `wait`), the reduce-scatter's by its function
    name (those dumps were not kept; the line number here is made up and not matched on), the
    abort in the same all-gather's wait that a later CI run printed (2026-12-05); a segfault with another
    frame innermost, or another fatal error inside c10d, does not."""
    site = "/tmp/ci/.venv/lib/python3.12/site-packages"

    def dump(error, *frames):
        lines = "\n".join(f'  File "{site}/{path}", line {n} in {fn}' for path, n, fn in frames)
        return f"Fatal Python error: {error}\n\nThread 0x7f3a (most recent call first):\n{lines}"

    c10d = "torch/distributed/distributed_c10d.py"
    buffer = "megatron/core/distributed/param_and_grad_buffer.py"
    assert crashed_in_c10d(dump("Segmentation fault", (c10d, 2696, "wait"),
                                (buffer, 555, "finish_param_sync")))
    assert crashed_in_c10d(dump("Segmentation fault", (c10d, 2651, "_coalescing_manager"),
                                (buffer, 420, "start_grad_sync")))
    assert not crashed_in_c10d(dump("Segmentation fault", (buffer, 555, "finish_param_sync"),
                                    (c10d, 2696, "wait")))
    assert crashed_in_c10d(dump("Aborted", (c10d, 2696, "wait"),
                                (buffer, 555, "finish_param_sync")))
    assert not crashed_in_c10d(dump("Floating point exception", (c10d, 2696, "wait")))
