"""A persistent kernel's timeout record becomes a message naming rank, kernel, role, tile and
stage, written once, before an uncaught exception's traceback (main thread or another one)
and at exit. The records are faked here (the GPU tests plant real stalls:
tests/gpu/test_failures.py)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_FAKE = """
import threading
from mok_megatron.cuda import stall_watch
reports = lambda: [{"kernel": "forward megakernel", "rank": 3, "role": "rows ready",
                    "block": 17, "tile": 42, "stage": 5, "timeout_ms": 2000}]
stall_watch.install(reports)
stall_watch.install(reports)
"""

EXPECTED = ("mok_megatron: TIMEOUT rank 3: a 'rows ready' wait of the forward megakernel gave "
            "up after 2000 ms (block 17, tile 42, stage 5)")


def _run(body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _FAKE + body], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_uncaught_error_is_preceded_by_the_report_once():
    proc = _run("raise RuntimeError('CUDA error: unspecified launch failure')")
    assert proc.returncode != 0
    assert proc.stderr.count(EXPECTED) == 1, proc.stderr  # not again at exit
    assert proc.stderr.index(EXPECTED) < proc.stderr.index("Traceback"), proc.stderr


def test_error_in_another_thread_is_preceded_by_the_report():
    proc = _run("t = threading.Thread(target=lambda: 1 / 0); t.start(); t.join()")
    assert proc.stderr.count(EXPECTED) == 1, proc.stderr
    assert proc.stderr.index(EXPECTED) < proc.stderr.index("ZeroDivisionError"), proc.stderr


def test_report_is_told_at_exit_without_an_error():
    proc = _run("print('done')")
    assert proc.returncode == 0 and proc.stderr.count(EXPECTED) == 1, proc.stderr
