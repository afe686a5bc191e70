"""Opt-in autoload: with ``MOK_MEGATRON=1``, Megatron learns ``mok`` as it is imported, so that
Megatron-LM's own command line works unchanged:

    MOK_MEGATRON=1 torchrun ... pretrain_gpt.py --moe-token-dispatcher-type mok ...

The file ``mok_megatron_autoload.pth`` (next to this module), once in site-packages, makes
Python's ``site`` run one line at start-up: it does nothing unless ``MOK_MEGATRON=1``, and then
calls ``install_hooks()``, which imports no Megatron and patches each Megatron module right
after it is first imported (a process that never imports Megatron is not touched).

    python -m mok_megatron.megatron.autoload install     # write the .pth into site-packages
    python -m mok_megatron.megatron.autoload uninstall
    python -m mok_megatron.megatron.autoload status
"""

from __future__ import annotations

import argparse
import importlib.abc
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Callable, Optional

ENV_VAR = "MOK_MEGATRON"
PTH_FILE = Path(__file__).with_name("mok_megatron_autoload.pth")


def _patch(name: str) -> Callable[[], None]:
    def run() -> None:
        from . import patches

        getattr(patches, name)()

    return run


# Each Megatron module, and the patch that extends it once it has executed.
_PATCHES = {
    "megatron.core.transformer.transformer_config": _patch("patch_transformer_config"),
    "megatron.core.transformer.moe.moe_layer": _patch("patch_moe_layer"),
    "megatron.training.arguments": _patch("patch_arguments"),
}


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to a module's own loader and runs a patch after the module has executed."""

    def __init__(self, loader, patch: Callable[[], None]):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch()

    def __getattr__(self, name):  # get_source, get_filename, ... for inspect and linecache
        return getattr(self._loader, name)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, patches: dict[str, Callable[[], None]]):
        self._pending = dict(patches)

    def find_spec(self, fullname, path, target=None):
        if fullname not in self._pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self._pending.pop(fullname))
        return spec


def install_hooks() -> None:
    """Patch Megatron's modules as they are imported (those already imported, now)."""
    pending = {}
    for module, patch in _PATCHES.items():
        if module in sys.modules:
            patch()
        else:
            pending[module] = patch
    if pending and not any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder(pending))


def _site_packages(target: Optional[str]) -> Path:
    return Path(target or sysconfig.get_paths()["purelib"])


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mok_megatron.megatron.autoload",
        description=f"Install the opt-in autoload of the mok dispatcher (active with {ENV_VAR}=1).",
    )
    parser.add_argument("action", choices=["install", "uninstall", "status"])
    parser.add_argument("--target", help="site-packages folder (default: this interpreter's)")
    opts = parser.parse_args(argv)
    installed = _site_packages(opts.target) / PTH_FILE.name
    if opts.action == "install":
        shutil.copyfile(PTH_FILE, installed)
        print(f"installed {installed}; set {ENV_VAR}=1 to register mok when Megatron is imported")
    elif opts.action == "uninstall":
        installed.unlink(missing_ok=True)
        print(f"removed {installed}")
    else:
        state = "installed" if installed.is_file() else "not installed"
        active = "on" if os.environ.get(ENV_VAR) == "1" else "off"
        print(f"{installed}: {state}; {ENV_VAR}={os.environ.get(ENV_VAR, '')!r} ({active})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
