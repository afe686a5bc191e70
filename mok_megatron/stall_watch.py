"""A persistent kernel's stall, told in words: rank, kernel, role, tile and stage.

When a bounded wait inside the forward megakernel or the grouped GEMM engine gives up, the
kernel writes where it was into host-mapped memory and traps (csrc/gemm/timeout_report.h).
CUDA itself then only says "unspecified launch failure", at whichever later call synchronizes.
A daemon thread, started by the first launch of such a kernel, reads those records every
``POLL_S`` seconds - plain host-memory reads, no CUDA call, so it works after the trap has
killed the context - and writes each new one to stderr at once; an exit hook writes any it has
not written yet (the main thread may die of the CUDA error first).

The peer barrier (csrc/comm/barrier.cu) reports its own timeouts with a device printf.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time

log = logging.getLogger(__name__)

POLL_S = 0.1

_lock = threading.Lock()
_told: set[tuple] = set()
_thread = None


def describe(report: dict) -> str:
    return (
        f"mok_megatron: TIMEOUT rank {report['rank']}: a {report['role']!r} wait of the "
        f"{report['kernel']} gave up after {report['timeout_ms']} ms (block {report['block']}, "
        f"tile {report['tile']}, stage {report['stage']}) and the kernel trapped; the CUDA "
        f"error that follows ('unspecified launch failure') is this stall. A rank or kernel "
        f"that stopped making progress causes it; if a healthy run can wait longer, raise the "
        f"recipe's kernel.spin_timeout_ms")


def tell_new_reports() -> list[str]:
    """Write every report not written yet to stderr (and the log); return their lines."""
    from .ops import timeout_reports

    lines = []
    with _lock:
        for report in timeout_reports():
            key = tuple(report.values())
            if key in _told:
                continue
            _told.add(key)
            line = describe(report)
            print(line, file=sys.stderr, flush=True)
            log.error(line)
            lines.append(line)
    return lines


def _watch() -> None:
    while True:
        time.sleep(POLL_S)
        tell_new_reports()


def start() -> None:
    """Start the watcher (once per process; later calls cost a global read)."""
    global _thread
    if _thread is not None:
        return
    with _lock:
        if _thread is not None:
            return
        _thread = threading.Thread(target=_watch, name="mok-stall-watch", daemon=True)
        _thread.start()
        atexit.register(tell_new_reports)
