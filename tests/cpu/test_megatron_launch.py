"""The two ways an unchanged Megatron script gets ``mok``: the launcher
(``python -m mok_megatron.megatron.launch SCRIPT ARGS``) and the opt-in autoload (the .pth file
plus MOK_MEGATRON=1); and without either, importing mok_megatron leaves Megatron unchanged.
Each case runs a fresh interpreter on a probe script that parses Megatron's arguments as
pretrain_gpt.py does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("megatron.training")

import megatron.core  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--moe-token-dispatcher-type", "mok", "--mok-recipe", "bf16"]

PROBE = textwrap.dedent("""
    import sys
    import neighbour  # pretrain_gpt.py imports modules next to it
    import megatron.core
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.training.arguments import parse_args

    args = parse_args()
    patched = getattr(MoELayer.routed_experts_compute, "__mok_megatron_patch__", False)
    print("RESULT", megatron.core.__shortversion__, __name__, args.moe_token_dispatcher_type,
          args.mok_recipe, patched, sys.argv[1:])
""")
# What the probe prints when it ran with mok, under the same megatron-core as this process.
EXPECTED = f"RESULT {megatron.core.__shortversion__} __main__ mok bf16 True {ARGS}"

# Runs a script the way `python SCRIPT` would, after putting SITE on the site path (Python
# processes .pth files of site directories only) and importing our packages first.
SITE_RUNNER = textwrap.dedent("""
    import runpy, site, sys
    import mok_megatron.megatron, mok_megatron.megatron.autoload
    site.addsitedir(sys.argv[1])
    sys.argv = sys.argv[2:]
    sys.path[0] = sys.argv[0].rpartition("/")[0]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


@pytest.fixture
def probe(tmp_path) -> Path:
    (tmp_path / "neighbour.py").write_text("")
    script = tmp_path / "pretrain_probe.py"
    script.write_text(PROBE)
    return script


def run(argv, tmp_path, autoload: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MOK_MEGATRON"}
    # This checkout first; the rest as given (CI puts an older megatron-core there).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    if autoload:
        env["MOK_MEGATRON"] = "1"
    return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def result_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))


def install_pth(tmp_path) -> Path:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    proc = run(["-m", "mok_megatron.megatron.autoload", "install", "--target", str(site_dir)],
               tmp_path, autoload=False)
    assert proc.returncode == 0, proc.stderr
    assert (site_dir / "mok_megatron_autoload.pth").is_file()
    return site_dir


@pytest.mark.parametrize("module", ["mok_megatron.launch", "mok_megatron.megatron.launch"])
def test_launcher_runs_the_script_unchanged(probe, tmp_path, module):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = run(["-m", module, str(probe), *ARGS], cwd, autoload=False)
    assert result_line(proc) == EXPECTED


def test_autoload_with_env_var(probe, tmp_path):
    site_dir = install_pth(tmp_path)
    proc = run(["-c", SITE_RUNNER, str(site_dir), str(probe), *ARGS], tmp_path, autoload=True)
    assert result_line(proc) == EXPECTED


def test_without_env_var_megatron_is_unchanged(probe, tmp_path):
    site_dir = install_pth(tmp_path)
    proc = run(["-c", SITE_RUNNER, str(site_dir), str(probe), *ARGS], tmp_path, autoload=False)
    assert proc.returncode == 2
    assert "invalid choice: 'mok'" in proc.stderr
