"""The Python floor of pyproject.toml is honest: no module of the package, the tools or the tests
needs a newer Python than ``requires-python`` says (syntax, standard-library modules and members,
annotations), as vermin reads them. Prints what needs a newer Python and exits 1 if anything does.

    python -m tools.dev.check_python_floor [PATH ...]   # default: captioning tools tests

vermin comes with the dev extra (pip install -e '.[dev]'). ``long`` is excluded: vermin takes
``torch.long`` for Python 2's builtin.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATHS = ("captioning", "tools", "tests")


def floor(pyproject: Path = ROOT / "pyproject.toml") -> str | None:
    """``requires-python``'s lower bound, e.g. "3.10"; None where it is not of the form ">=3.N"."""
    found = re.search(r'^requires-python\s*=\s*">=\s*(3\.\d+)"', pyproject.read_text(), re.M)
    return found.group(1) if found else None


def vermin(paths, target: str) -> subprocess.CompletedProcess:
    """vermin on ``paths``, failing where they need a newer Python than ``target``."""
    args = ["--no-tips", "--violations", "--eval-annotations", "--exclude", "long", f"--target={target}-"]
    return subprocess.run(
        [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())", *args, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="files or folders to check (default: %(default)s)", default=PATHS)
    args = parser.parse_args(argv)
    if importlib.util.find_spec("vermin") is None:
        print("check_python_floor: vermin is not installed (the dev extra: pip install -e '.[dev]')", file=sys.stderr)
        return 2
    target = floor()
    if target is None:
        print('pyproject.toml: requires-python is not of the form ">=3.N"', file=sys.stderr)
        return 1
    paths = [p if Path(p).is_absolute() else ROOT / p for p in args.paths]
    result = vermin(paths, target)
    if result.returncode != 0:
        print(result.stdout + result.stderr, end="")
        print(
            f"code that needs a newer Python than {target}, pyproject.toml's requires-python (raise it in a commit of its own)"
        )
        return 1
    print(f"the code runs on Python {target}, pyproject.toml's requires-python (vermin)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
