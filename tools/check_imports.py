"""List the import cycles inside the package: modules that import, directly or through others, a
module that imports them back. Exits 1 if there is one.

    python tools/check_imports.py [--package captioning]

Every ``import`` counts, at module level or inside a function (a lazy import is still a
dependency). ``from captioning.a import b`` is an edge to ``captioning.a.b`` when that is a
module, else to ``captioning.a``. The implicit import of a package's ``__init__`` when one of its
submodules is imported is not an edge (it is how packages work).
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_names(package_dir: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of the package."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join([package, *parts])] = path
    return names


def imports_of(name: str, path: Path, modules: dict[str, Path], package: str) -> set[str]:
    """The package's modules that ``name`` imports."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin for alias in node.names]
        else:
            continue
        for target in targets:
            if target == package or target.startswith(package + "."):
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]  # `import captioning.a.b` of a name inside a module
                if target in modules and target != name:
                    found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def import_graph(package: str = "captioning", root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_names(root / package, package)
    return {name: imports_of(name, path, modules, package) for name, path in modules.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", default="captioning")
    args = p.parse_args(argv)
    graph = import_graph(args.package)
    found = cycles(graph)
    for component in found:
        print("import cycle: " + " <-> ".join(component))
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports, {len(found)} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
