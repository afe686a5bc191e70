"""The megatron-core range setup.py accepts and the versions CI tests (scripts/versions.sh)
agree: every tested version lies in the range, the default is the newest tested and the
range's floor is tested."""

import re
import subprocess
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def ci_versions() -> tuple[Version, list[Version]]:
    script = ("source scripts/versions.sh; echo $MEGATRON_CORE_VERSION; "
              "echo ${MEGATRON_CORE_ALSO_TESTED[@]}")
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return Version(out[0]), [Version(v) for v in out[1].split()]


def supported_range() -> SpecifierSet:
    (spec,) = re.findall(r'"megatron-core([^"]*)"', (REPO / "setup.py").read_text())
    return SpecifierSet(spec)


def test_tested_versions_span_the_supported_range():
    default, others = ci_versions()
    supported = supported_range()
    assert others, "CI tests no megatron-core besides the default"
    for version in (default, *others):
        assert version in supported, f"megatron-core {version} is tested but not in {supported}"
    assert default == max(default, *others)
    (floor,) = [s.version for s in supported if s.operator == ">="]
    assert Version(floor) == min(others), f"the floor {floor} of {supported} is not tested"
