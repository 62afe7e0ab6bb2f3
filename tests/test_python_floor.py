"""The Python floor in pyproject.toml is honest: no module of the package, the tools or the tests needs a newer
Python than ``requires-python`` says (syntax, standard-library modules and members, annotations), as vermin
reads them; and the check itself catches code that needs a newer Python."""

import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytest.importorskip("vermin", reason="the dev extra is not installed: pip install -e '.[dev]'")


def floor() -> str:
    """``requires-python``'s lower bound, e.g. "3.10"."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'^requires-python\s*=\s*">=\s*(3\.\d+)"', text, re.M)
    assert found, 'pyproject.toml: requires-python is not of the form ">=3.N"'
    return found.group(1)


def vermin(*paths) -> subprocess.CompletedProcess:
    """vermin on ``paths``, failing where they need a newer Python than the floor. ``long``: vermin takes
    ``torch.long`` for Python 2's builtin."""
    args = [
        sys.executable,
        "-c",
        "import sys, vermin; sys.exit(vermin.main())",
        "--no-tips",
        "--violations",
        "--eval-annotations",
        "--exclude",
        "long",
        f"--target={floor()}-",
        *map(str, paths),
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_the_code_runs_on_the_floor():
    result = vermin(ROOT / "captioning", ROOT / "tools", ROOT / "tests")
    assert result.returncode == 0, f"code that needs a newer Python than {floor()}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("line", ["import tomllib", "from typing import Self", "type Alias = int"])
def test_the_check_catches_newer_code(tmp_path, line):
    """Each line needs Python 3.11 or 3.12: the check fails on it (while the floor is below them)."""
    path = tmp_path / "newer.py"
    path.write_text(line + "\n")
    result = vermin(path)
    assert result.returncode != 0 and "newer.py" in result.stdout, result.stdout
