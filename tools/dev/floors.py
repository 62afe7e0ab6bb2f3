"""The dependency floors of pyproject.toml as pip constraints: ``name==floor``, one a line.

``make test-floors`` installs the project with these constraints into a fresh virtual environment and
runs the smoke set (tools/dev/smoke.py) there, so that every ``>=`` floor pyproject.toml declares is a
release the code runs on. The list is read from pyproject.toml each time: there is no second list.

    python -m tools.dev.floors [--extras web,onnx] [--newest torch,torchvision] [--out floors.txt]

``--extras``: the optional-dependency groups pinned besides the dependencies; ``--newest``: packages
left out of the pins (the newest release pip finds; PyTorch's wheels are the largest download and
torchvision's release follows torch's, so ``make test-floors`` leaves both newest).
Requirement extras (``jsonargparse[signatures]``) are dropped: pip's constraints take none.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# name, [extras], and the floor of a requirement written as pyproject.toml writes them: "name[extra]>=1.2"
_REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)\s*(?:\[[^\]]*\])?\s*(.*)")


def _pyproject(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    if sys.version_info >= (3, 11):
        import tomllib  # novermin  (the branch of Python 3.11 and later)
    else:  # pragma: no cover - Python 3.10 has no tomllib; pip vendors tomli
        from pip._vendor import tomli as tomllib
    return tomllib.loads(text)


def normalise(name: str) -> str:
    """A distribution's name as PyPI compares them (PEP 503): "Open_Clip.Torch" -> "open-clip-torch"."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path = ROOT / "pyproject.toml", extras: tuple[str, ...] = ()) -> list[str]:
    """The dependencies and those of ``extras``, as pyproject.toml writes them (an unknown extra: ValueError)."""
    project = _pyproject(pyproject)["project"]
    groups = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in groups]
    if unknown:
        raise ValueError(f"pyproject.toml has no extra {unknown[0]!r} (it has {', '.join(sorted(groups))})")
    return list(project["dependencies"]) + [r for e in extras for r in groups[e]]


def floor(requirement: str) -> tuple[str, str]:
    """(normalised name, floor) of a requirement; ValueError unless it has exactly one ``>=`` floor
    (a cap beside it, ``>=1,<2``, is allowed)."""
    match = _REQUIREMENT.fullmatch(requirement.split(";")[0].strip())
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    name, spec = match.groups()
    floors = [part.strip()[2:].strip() for part in spec.split(",") if part.strip().startswith(">=")]
    if len(floors) != 1:
        raise ValueError(
            f"{requirement!r}: expected one '>=' floor (every dependency declares the oldest release it runs on)"
        )
    return normalise(name), floors[0]


def constraints(extras: tuple[str, ...] = (), newest: tuple[str, ...] = (), pyproject: Path = ROOT / "pyproject.toml"):
    """``name==floor`` for every requirement of the dependencies and ``extras``, but those in ``newest``."""
    skip = {normalise(n) for n in newest}
    pins: dict[str, str] = {}
    for requirement in requirements(pyproject, extras):
        name, version = floor(requirement)
        if name not in skip:
            pins[name] = max(pins.get(name, version), version, key=_version_key)  # one pin per name
    return [f"{name}=={version}" for name, version in pins.items()]


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default="", help="optional-dependency groups to pin too, comma-separated")
    parser.add_argument("--newest", default="", help="packages not pinned (their newest release), comma-separated")
    parser.add_argument("--out", default=None, help="write the constraints here (default: print them)")
    args = parser.parse_args(argv)
    split = lambda text: tuple(p.strip() for p in text.split(",") if p.strip())  # noqa: E731
    try:
        lines = constraints(split(args.extras), split(args.newest))
    except ValueError as err:
        print(f"pyproject.toml: {err}", file=sys.stderr)
        return 2
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
