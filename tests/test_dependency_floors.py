"""The dependency floors stand at the releases that fixed the security problems the code relies on
being fixed: weights-only torch.load (torch 2.6), starlette's Range-header DoS (0.49.1) and
python-multipart's CVE-2024-53981 (0.0.18), and datasets no longer running a dataset's loading script by
default (2.20)."""

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
FLOORS = {"torch": (2, 6), "starlette": (0, 49, 1), "python-multipart": (0, 0, 18), "datasets": (2, 20)}


def _floors() -> dict:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    found = {}
    for requirement in project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?>=([0-9.]+)", requirement.replace(" ", ""))
        if match:
            found[match.group(1).lower()] = tuple(int(x) for x in match.group(2).split("."))
    return found


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_floor_is_at_the_fixed_release(package):
    floors = _floors()
    assert package in floors, f"{package} has no >= floor in pyproject.toml"
    assert floors[package] >= FLOORS[package], (
        f"{package}>={'.'.join(map(str, floors[package]))} allows releases before the fix"
    )
