"""docs/ARCHITECTURE.md names every module of the package (issue: "names every module").

    python -m tools.dev.check_architecture [--doc docs/ARCHITECTURE.md] [--package captioning]

A module counts as named when the tree's table has a row that names its directory in the first cell
(``data/formats/base.py`` names ``data/formats/``, ```metrics/``` names ``metrics/``) and names the module
itself anywhere in that row: ``karpathy.py``, ```train``` (a command module by its stem), or its path.
A package's ``__init__.py`` is named by any row of its directory; ``__main__.py`` by ``python -m`` or ``__main__.py``.
Exit 1 listing the modules no row names.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

TICKED = re.compile(r"`([^`]+)`")


def rows(doc: str) -> list[tuple[set[str], str]]:
    """(the directories the first cell names, the whole row) of every table row."""
    found = []
    for line in doc.splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        first = line.split("|")[1]
        dirs = set()
        for tick in TICKED.findall(first):
            tick = tick.strip()
            if tick.endswith("/"):
                dirs.add(tick)
            elif "/" in tick:
                dirs.add(tick.rsplit("/", 1)[0] + "/")
            elif tick.endswith(".py"):
                dirs.add("")  # a top-level module
        found.append((dirs, line))
    return found


def named(module: Path, package: Path, table: list[tuple[set[str], str]]) -> bool:
    rel = module.relative_to(package).as_posix()
    folder = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
    name, stem = module.name, module.stem
    for dirs, line in table:
        if rel in line:
            return True
        if folder not in dirs:
            continue
        ticks = {t.strip() for t in TICKED.findall(line)}
        if name == "__init__.py":
            return True  # a row describes the package's modules
        if name == "__main__.py" and ("__main__.py" in line or "python -m" in line):
            return True
        if name in ticks or stem in ticks or any(t.endswith("/" + name) for t in ticks):
            return True
    return False


def unnamed(doc_path: Path, package: Path) -> list[str]:
    table = rows(doc_path.read_text(encoding="utf-8"))
    return [
        m.relative_to(package).as_posix()
        for m in sorted(package.rglob("*.py"))
        if m.relative_to(package).as_posix() != "__init__.py" and not named(m, package, table)
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.dev.check_architecture", description=__doc__.split("\n\n")[0])
    p.add_argument("--doc", type=Path, default=Path("docs/ARCHITECTURE.md"))
    p.add_argument("--package", type=Path, default=Path("captioning"))
    args = p.parse_args(argv)
    missing = unnamed(args.doc, args.package)
    for m in missing:
        print(f"{args.doc}: no row of the tree names {args.package}/{m}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
