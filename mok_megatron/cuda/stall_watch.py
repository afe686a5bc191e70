"""A persistent kernel's stall, told in words: rank, kernel, role, tile and stage.

When a bounded wait inside the forward megakernel or the grouped GEMM engine gives up, the
kernel writes where it was into host-mapped memory and traps (csrc/gemm/timeout_report.h).
CUDA itself then only says "unspecified launch failure", at whichever later call synchronizes,
and every CUDA call after it fails the same way. ``install(ops.timeout_reports)``, run by the first launch of
such a kernel, makes the process tell the records on stderr before the error's traceback
(``sys.excepthook``, ``threading.excepthook``) and at exit (``atexit``), wherever the error
surfaces: reading them is plain host-memory reads, which still work after the trap has ended
the CUDA context. No thread polls them: the error always ends in one of those places.

The peer barrier (csrc/comm/barrier.cu) reports its own timeouts with a device printf.
"""

from __future__ import annotations

import atexit
import sys
import threading
from typing import Callable, Optional

_lock = threading.Lock()
_told: set[tuple] = set()
_installed = False
_read_reports: Optional[Callable[[], list[dict]]] = None


def describe(report: dict) -> str:
    return (
        f"mok_megatron: TIMEOUT rank {report['rank']}: a {report['role']!r} wait of the "
        f"{report['kernel']} gave up after {report['timeout_ms']} ms (block {report['block']}, "
        f"tile {report['tile']}, stage {report['stage']}) and the kernel trapped; the CUDA "
        f"error that follows ('unspecified launch failure') is this stall. A rank or kernel "
        f"that stopped making progress causes it; if a healthy run can wait longer, raise the "
        f"recipe's kernel.spin_timeout_ms")


def tell_new_reports() -> list[str]:
    """Write every report not written yet to stderr; return their lines."""
    if _read_reports is None:
        return []
    try:
        reports = _read_reports()
    except RuntimeError:  # no extension (a CPU-only process): nothing can have trapped
        return []
    lines = []
    with _lock:
        for report in reports:
            key = tuple(report.values())
            if key in _told:
                continue
            _told.add(key)
            line = describe(report)
            print(line, file=sys.stderr, flush=True)
            lines.append(line)
    return lines


def install(read_reports: Callable[[], list[dict]]) -> None:
    """Tell the reports `read_reports` returns (ops.timeout_reports) before any uncaught
    exception's traceback and at exit (once per process; later calls cost a global read)."""
    global _installed, _read_reports
    if _installed:
        return
    with _lock:
        if _installed:
            return
        _installed = True
        _read_reports = read_reports
        outer_excepthook = sys.excepthook
        outer_thread_excepthook = threading.excepthook

        def excepthook(*args):
            tell_new_reports()
            outer_excepthook(*args)

        def thread_excepthook(args):
            tell_new_reports()
            outer_thread_excepthook(args)

        sys.excepthook = excepthook
        threading.excepthook = thread_excepthook
        atexit.register(tell_new_reports)
