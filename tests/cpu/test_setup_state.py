"""scripts/setup_state.py, which decides what scripts/setup_env.sh redoes (no pip runs here):
an unchanged tree skips both steps, a changed csrc/ file rebuilds the extension only, a changed
pin or setup.py reinstalls and then rebuilds, a changed environment or a removed build is
redone, and a step begun but never done (failed, interrupted) runs again."""

import importlib.machinery
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import setup_state  # noqa: E402

REQUIREMENTS = ["torch==2.11.0", "-e", ".[test,bench]", "megatron-core==0.19.2"]
BUILT = f"_C{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_dist(site: Path, name: str, version: str) -> None:
    write(site / f"{name}-{version}.dist-info" / "METADATA",
          f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A checkout with a csrc/ tree, a built extension and a site-packages of its own, whose
    package imports from it."""
    root = tmp_path / "repo"
    write(root / "setup.py", "setup()\n")
    write(root / "pyproject.toml", "[build-system]\n")
    write(root / "README.md", "readme\n")
    write(root / "csrc" / "ops.h", "#pragma once\n")
    write(root / "csrc" / "gemm" / "grouped_gemm.cu", "// kernel\n")
    write(root / "mok_megatron" / "__init__.py", "")
    write(root / "mok_megatron" / BUILT, "binary")
    site = tmp_path / "site-packages"
    write_dist(site, "torch", "2.11.0")
    monkeypatch.setattr(setup_state, "_site_dirs", lambda: [str(site)])
    monkeypatch.setattr(setup_state, "_package_dir", lambda: str(root / "mok_megatron"))
    monkeypatch.delenv("MOK_BUILD_CUDA", raising=False)
    return root


def stamp_of(repo: Path) -> Path:
    return repo / "stamp.json"


def begin(repo: Path, step: str, requirements=REQUIREMENTS):
    key = setup_state.key_of(repo, step, requirements)
    return setup_state.begin(stamp_of(repo), repo, step, key)


def set_up(repo: Path, requirements=REQUIREMENTS) -> tuple:
    """What setup_env.sh does: each step that is not current runs (and succeeds). Returns why
    each step ran (None: skipped)."""
    reasons = []
    for step in setup_state.STEPS:
        reason = begin(repo, step, requirements)
        if reason is not None:
            setup_state.done(stamp_of(repo), repo, step)
        reasons.append(reason)
    return tuple(reasons)


def test_unchanged_tree_skips_both_steps(repo):
    assert set_up(repo) == ("not done yet", "not done yet")
    assert set_up(repo) == (None, None)


def test_python_and_doc_changes_need_nothing(repo):
    set_up(repo)
    write(repo / "mok_megatron" / "__init__.py", "VALUE = 1\n")
    write(repo / "README.md", "changed\n")
    assert set_up(repo) == (None, None)


@pytest.mark.parametrize("path", ["csrc/gemm/grouped_gemm.cu", "csrc/ops.h", "csrc/new/added.cu"])
def test_changed_csrc_file_rebuilds_the_extension_only(repo, path):
    set_up(repo)
    write(repo / path, "// changed\n")
    assert set_up(repo) == (None, "changed: csrc")
    assert set_up(repo) == (None, None)


def test_removed_csrc_file_rebuilds_the_extension(repo):
    set_up(repo)
    (repo / "csrc" / "ops.h").unlink()
    assert set_up(repo) == (None, "changed: csrc")


def test_changed_pin_reinstalls_then_rebuilds(repo):
    set_up(repo)
    older = [r.replace("0.19.2", "0.18.2") for r in REQUIREMENTS]
    # The extension step is dropped with the install: it builds against what was installed.
    assert set_up(repo, older) == ("changed: requirements", "not done yet")
    assert set_up(repo, older) == (None, None)


def test_changed_setup_py_reinstalls_and_rebuilds(repo):
    set_up(repo)
    write(repo / "setup.py", "setup(name='x')\n")
    assert set_up(repo) == ("changed: setup.py", "not done yet")


def test_changed_build_environment_rebuilds(repo, monkeypatch):
    set_up(repo)
    monkeypatch.setenv("MOK_BUILD_CUDA", "0")
    assert set_up(repo) == (None, "changed: build environment")


def test_environment_changed_outside_setup_reinstalls(repo, tmp_path):
    set_up(repo)
    site = tmp_path / "site-packages"
    for dist_info in site.glob("torch-*.dist-info"):
        (dist_info / "METADATA").unlink()
        dist_info.rmdir()
    write_dist(site, "torch", "2.12.0")  # e.g. a pip install by hand
    assert set_up(repo) == ("its result changed since (distributions)", "not done yet")


def test_package_importing_from_elsewhere_reinstalls(repo, monkeypatch, tmp_path):
    set_up(repo)
    monkeypatch.setattr(setup_state, "_package_dir", lambda: str(tmp_path / "other"))
    assert begin(repo, "install") == "its result changed since (package)"
    # An install after which the package still imports from elsewhere is not recorded as done.
    with pytest.raises(SystemExit, match="imports from .*other, not from .*repo"):
        setup_state.done(stamp_of(repo), repo, "install")


def test_removed_or_rebuilt_extension_file_is_rebuilt(repo):
    set_up(repo)
    (repo / "mok_megatron" / BUILT).unlink()
    assert set_up(repo) == (None, "its result changed since (built)")
    write(repo / "mok_megatron" / BUILT, "another binary")
    assert set_up(repo) == (None, "its result changed since (built)")


@pytest.mark.parametrize("step", setup_state.STEPS)
def test_step_begun_but_not_done_runs_again(repo, step):
    set_up(repo)
    write(repo / "setup.py", "setup(name='x')\n")  # both steps must run
    assert begin(repo, "install") is not None
    if step == "extension":
        setup_state.done(stamp_of(repo), repo, "install")
        assert begin(repo, "extension") is not None
    # ... and the step fails or is interrupted here: no done(). The stamp does not say done.
    assert step not in setup_state.load(stamp_of(repo))
    assert begin(repo, step) == "not done yet"


def test_unreadable_stamp_redoes_everything(repo):
    set_up(repo)
    stamp_of(repo).write_text('{"install": ')  # cut short
    assert set_up(repo) == ("not done yet", "not done yet")


def test_done_needs_begin_and_the_earlier_steps(repo):
    with pytest.raises(SystemExit, match="was not begun"):
        setup_state.done(stamp_of(repo), repo, "install")
    begin(repo, "extension")
    with pytest.raises(SystemExit, match="before install was done"):
        setup_state.done(stamp_of(repo), repo, "extension")


def test_this_checkout_counts_as_installed():
    """The check the install step applies to the real environment holds for the package these
    tests import (else every set-up would reinstall)."""
    import mok_megatron

    assert setup_state._package_dir() == str(REPO / "mok_megatron")
    assert Path(mok_megatron.__file__).resolve().parent == REPO / "mok_megatron"
