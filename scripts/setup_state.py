"""Which set-up steps of scripts/setup_env.sh must run again, from a stamp file in .venv.

Two steps, in order:
  install    pip installs torch, the build tools and this package (editable) with its
             dependencies. Its key: setup.py, pyproject.toml, the requirements setup_env.sh
             asks for and the Python version.
  extension  `setup.py build_ext --inplace` compiles csrc/ into mok_megatron/_C (ninja keeps
             its objects in build/, so only what changed recompiles). Its key: every file
             under csrc/, setup.py (the compile flags), the Python, torch and nvcc versions and
             the environment variables the build reads.

A step is current when the stamp holds its key and what the step left is still there: the
distributions in site-packages (name and version) and mok_megatron importing from this
checkout; the built extension files (size and mtime). Python files need no step at all, as
the install is editable.

`begin STEP` prints `current`, or `stale: WHY` after dropping the step (and every later one)
from the stamp and keeping its key, computed before the work, as pending; `done STEP` records
that key only after the work succeeded. A step that fails or is interrupted therefore runs
again next time.

    python scripts/setup_state.py begin STAMP install REQUIREMENT...
    python scripts/setup_state.py done STAMP install
    python scripts/setup_state.py begin STAMP extension
    python scripts/setup_state.py done STAMP extension
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Optional, Sequence

STEPS = ("install", "extension")
REPO = Path(__file__).resolve().parents[1]
PACKAGE = "mok_megatron"

# What setup.py and torch's extension builder read from the environment.
BUILD_ENV_VARS = ("MOK_BUILD_CUDA", "CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "CC", "CXX",
                  "CFLAGS", "CPPFLAGS", "CXXFLAGS", "LDFLAGS", "NVCC_PREPEND_FLAGS",
                  "NVCC_APPEND_FLAGS")


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:  # length-prefixed, so that no two different part lists hash alike
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def _file(path: Path) -> str:
    return _digest(path.read_bytes()) if path.is_file() else "absent"


def _tree(root: Path) -> str:
    """Every file under root, by relative path and content (an added or removed file counts)."""
    parts = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        parts += [path.relative_to(root).as_posix().encode(), path.read_bytes()]
    return _digest(*parts)


def _text(value: object) -> str:
    return _digest(json.dumps(value, sort_keys=True).encode())


def _torch_build() -> str:
    """torch's version and CUDA version, from its version.py (importing torch takes seconds)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "absent"
    return _file(Path(next(iter(spec.submodule_search_locations))) / "version.py")


def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "absent"
    run = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    return _text([nvcc, run.returncode, run.stdout])


def install_key(repo: Path, requirements: Sequence[str]) -> dict[str, str]:
    return {
        "setup.py": _file(repo / "setup.py"),
        "pyproject.toml": _file(repo / "pyproject.toml"),
        "requirements": _text(list(requirements)),
        "python": _text(sys.version),
    }


def extension_key(repo: Path) -> dict[str, str]:
    return {
        "csrc": _tree(repo / "csrc"),
        "setup.py": _file(repo / "setup.py"),
        "python": _text(sys.version),
        "torch": _torch_build(),
        "nvcc": _nvcc(),
        "build environment": _text({k: os.environ.get(k) for k in BUILD_ENV_VARS}),
    }


def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def _package_dir() -> Optional[str]:
    spec = importlib.util.find_spec(PACKAGE)
    return str(Path(spec.origin).resolve().parent) if spec and spec.origin else None


def observe(repo: Path, step: str) -> dict:
    """What a finished step leaves behind, to compare with what it left when it was recorded."""
    if step == "install":
        dists = sorted(f"{d.metadata['Name']}=={d.version}"
                       for d in importlib.metadata.distributions(path=_site_dirs()))
        return {"distributions": _text(dists), "package": _package_dir()}
    built = {}
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = repo / PACKAGE / f"_C{suffix}"
        if path.is_file():
            stat = path.stat()
            built[path.relative_to(repo).as_posix()] = [stat.st_size, stat.st_mtime_ns]
    return {"built": built}


def _check_observed(repo: Path, step: str, observed: dict) -> Optional[str]:
    """Why what the environment holds now rules the step out, if it does."""
    if step == "install" and observed["package"] != str(repo / PACKAGE):
        return f"{PACKAGE} imports from {observed['package']}, not from {repo / PACKAGE}"
    return None


def stale_reason(record: Optional[dict], key: dict, observed: dict) -> Optional[str]:
    """None when the recorded step matches key and observed, else what differs."""
    if record is None:
        return "not done yet"
    changed = sorted(name for name in key if record["key"].get(name) != key[name])
    if changed:
        return "changed: " + ", ".join(changed)
    if record["observed"] != observed:
        return "its result changed since (" + ", ".join(
            name for name in observed if record["observed"].get(name) != observed[name]) + ")"
    return None


def load(stamp: Path) -> dict:
    try:
        data = json.loads(stamp.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def save(stamp: Path, data: dict) -> None:
    partial = stamp.with_name(stamp.name + ".partial")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(partial, stamp)  # never a half-written stamp


def key_of(repo: Path, step: str, requirements: Sequence[str]) -> dict[str, str]:
    return install_key(repo, requirements) if step == "install" else extension_key(repo)


def begin(stamp: Path, repo: Path, step: str, key: dict) -> Optional[str]:
    """None when the step is current; else drop it and every later step from the stamp, keep
    its key as pending, and return why it must run."""
    data = load(stamp)
    observed = observe(repo, step)
    reason = stale_reason(data.get(step), key, observed) or _check_observed(repo, step, observed)
    if reason is None:
        return None
    for later in STEPS[STEPS.index(step):]:
        data.pop(later, None)
    data.setdefault("pending", {})[step] = key
    save(stamp, data)
    return reason


def done(stamp: Path, repo: Path, step: str) -> None:
    """Record the step begun last as done, with what it left behind."""
    data = load(stamp)
    key = data.get("pending", {}).pop(step, None)
    if key is None:
        raise SystemExit(f"setup_state: {step} was not begun (no pending key in {stamp})")
    earlier = STEPS[:STEPS.index(step)]
    missing = [s for s in earlier if s not in data]
    if missing:
        raise SystemExit(f"setup_state: {step} finished before {', '.join(missing)} was done")
    observed = observe(repo, step)
    problem = _check_observed(repo, step, observed)
    if problem:
        raise SystemExit(f"setup_state: {step} finished, but {problem}")
    data[step] = {"key": key, "observed": observed}
    save(stamp, data)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("begin", "done") or argv[2] not in STEPS:
        raise SystemExit(__doc__.split("\n\n")[-1])
    action, stamp, step, requirements = argv[0], Path(argv[1]), argv[2], argv[3:]
    if action == "done":
        done(stamp, REPO, step)
        return 0
    reason = begin(stamp, REPO, step, key_of(REPO, step, requirements))
    print("current" if reason is None else f"stale: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
