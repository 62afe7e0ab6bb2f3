"""The notebooks of examples/ and examples/zh/: their .ipynb written from the jupytext sources, checked
against them, and executed top to bottom (``make notebooks``).

    python examples/run_notebooks.py                 # execute every notebook; the executed copies and
                                                     # times.json in outputs/notebooks/executed/
    python examples/run_notebooks.py --steps 20 examples/1_soft_and_hard_attention.ipynb   # one, briefly
    python examples/run_notebooks.py --sync          # write each .ipynb from its .py source
    python examples/run_notebooks.py --check         # exit 1 when an .ipynb differs from its .py

The ``.py`` files (jupytext's percent format) are the sources; the ``.ipynb`` beside them, without
outputs, are what Jupyter and Colab open. ``--steps N`` sets the ``STEPS`` of each notebook's
parameters cell (a quick run; the notebooks' own values are what the docs describe).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
REPO = EXAMPLES.parent


def sources() -> list[Path]:
    """Every notebook source: examples/<n>_*.py and examples/zh/<n>_*.py."""
    return sorted(EXAMPLES.glob("[0-9]_*.py")) + sorted((EXAMPLES / "zh").glob("[0-9]_*.py"))


def notebook_of(source: Path):
    """The notebook a jupytext source reads as (cells, no outputs)."""
    import jupytext

    notebook = jupytext.read(source)
    notebook.metadata.pop("jupytext", None)
    for i, cell in enumerate(notebook.cells):  # ids by position: --sync writes the same file each time
        cell.id = f"cell-{i}"
    return notebook


def cells(notebook) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in notebook.cells]


def sync() -> None:
    import nbformat

    for source in sources():
        nbformat.write(notebook_of(source), source.with_suffix(".ipynb"))
        print(f"wrote {source.with_suffix('.ipynb').relative_to(REPO)}")


def check() -> list[str]:
    """One line per notebook whose .ipynb is missing or differs from its .py source."""
    import nbformat

    problems = []
    for source in sources():
        target = source.with_suffix(".ipynb")
        if not target.is_file():
            problems.append(f"{target.relative_to(REPO)}: missing; run python examples/run_notebooks.py --sync")
        elif cells(nbformat.read(target, as_version=4)) != cells(notebook_of(source)):
            problems.append(
                f"{target.relative_to(REPO)}: differs from {source.name}; run python examples/run_notebooks.py --sync"
            )
    return problems


def with_steps(notebook, steps: int | None):
    """``notebook`` with ``STEPS = steps`` in its parameters cell."""
    if steps is not None:
        for cell in notebook.cells:
            if "parameters" in cell.metadata.get("tags", []):
                cell.source = re.sub(r"(?m)^STEPS = \d+", f"STEPS = {steps}", cell.source)
    return notebook


def execute(path: Path, out: Path, timeout: int, steps: int | None) -> dict:
    """Run ``path`` (an .ipynb, or a .py source) top to bottom in its own folder; write the executed copy
    under ``out``; return its wall and CPU seconds (the kernel's, a child process of this one)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = notebook_of(path) if path.suffix == ".py" else nbformat.read(path, as_version=4)
    notebook = with_steps(notebook, steps)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    client = NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    error = None
    try:
        client.execute()
    except Exception as err:  # a failing cell: its traceback is in the executed copy
        lines = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip().splitlines()  # without the terminal's colours
        error = lines[-1] if lines else type(err).__name__
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    name = str(path.relative_to(EXAMPLES).with_suffix(".ipynb"))
    target = out / name
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return {"notebook": name, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "error": error}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", type=Path, help="notebooks to execute (default: all of them)")
    p.add_argument("--sync", action="store_true", help="write each .ipynb from its .py source")
    p.add_argument("--check", action="store_true", help="exit 1 when an .ipynb differs from its .py source")
    p.add_argument("--timeout", type=int, default=900, help="seconds a cell may run (default 900)")
    p.add_argument("--steps", type=int, default=None, help="the STEPS of every notebook's parameters cell")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "notebooks" / "executed")
    args = p.parse_args(argv)
    if args.sync:
        sync()
        return 0
    problems = check()
    if args.check or problems:
        print("\n".join(problems) or f"the {len(sources())} notebooks agree with their sources")
        return 1 if problems else 0
    times = []
    for path in [Path(n).resolve() for n in args.notebooks] or [s.with_suffix(".ipynb") for s in sources()]:
        result = execute(path, args.out, args.timeout, args.steps)
        times.append(result)
        status = f"FAILED: {result['error']}" if result["error"] else "ok"
        print(
            f"{result['notebook']:<45} {result['wall_s']:7.1f} s wall {result['cpu_s']:7.1f} s CPU  {status}",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "times.json").write_text(json.dumps(times, indent=1))
    failed = [t["notebook"] for t in times if t["error"]]
    total = sum(t["wall_s"] for t in times)
    print(f"{len(times) - len(failed)} passed, {len(failed)} failed in {total:.0f} s (executed copies: {args.out})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
