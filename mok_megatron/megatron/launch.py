"""Run a Megatron training script with the ``mok`` dispatcher registered.

    torchrun --nproc-per-node 8 -m mok_megatron.megatron.launch \
        /path/to/Megatron-LM/pretrain_gpt.py --moe-token-dispatcher-type mok ...

The script runs unchanged, as ``__main__``, with ``sys.argv`` and ``sys.path[0]`` as it would
see them when started directly (pretrain_gpt.py imports its neighbours, and a Megatron-LM
checkout's ``megatron`` package then wins over an installed one, as it would without us).
"""

from __future__ import annotations

import os
import runpy
import sys

from . import register

USAGE = "usage: python -m mok_megatron.megatron.launch SCRIPT.py [SCRIPT ARGS...]"


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit(USAGE)
    script = os.path.abspath(argv[0])
    if not os.path.isfile(script):
        raise SystemExit(f"mok_megatron launch: no such script: {argv[0]}\n{USAGE}")
    sys.argv = [script, *argv[1:]]
    # As when the script runs directly: its folder, not the working directory, heads sys.path.
    # Before register(), which imports Megatron: it must be the one the script would import.
    sys.path[0] = os.path.dirname(script)
    register()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
