"""Check the package's imports: no import cycles, no import from a lower layer into a higher one, and
no Lightning on the inference side. Prints each problem and exits 1 if there is one.

    python -m tools.dev.check_imports

Every ``import`` counts, at module level or inside a function (a lazy import is still a
dependency). ``from captioning.a import b`` is an edge to ``captioning.a.b`` when that is a
module, else to ``captioning.a``. The implicit import of a package's ``__init__`` when one of its
submodules is imported is not an edge (it is how packages work).

The rules are the tables below. A name in them stands for that module and, for a package, every
module under it; the longest name that matches places a module. ``captioning.__init__`` is the
package's own ``__init__`` alone.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The layers, lowest first. A module may import modules of its own layer and of lower ones, never
# of a higher one. A module that no name here places is reported: place it.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "ground",
        [
            "captioning.__init__",
            "captioning.errors",
            "captioning.registry",
            "captioning.checked",
            "captioning.compat",
            "captioning.vocab",
            "captioning.tokenizers",
            "captioning.word_chars",
            "captioning.hub_weights",
            "captioning.files",
            "captioning.common",
            "captioning.cuda_graphs",
            "captioning.plugins",
        ],
    ),
    ("data", ["captioning.data", "captioning.metrics", "captioning.viz"]),
    # one layer: ShowAttendTell.generate calls the decoding loops, which run the model's parts; the fast
    # path is the models' twin, which the decoding of ensembles uses
    ("models", ["captioning.models", "captioning.decoding", "captioning.fast"]),
    ("objectives", ["captioning.objectives"]),
    ("storage", ["captioning.storage", "captioning.export"]),
    # decoding a split and scoring it with the registered metrics: validation's, test's and evaluate's
    ("evaluation", ["captioning.evaluation"]),
    # the feature-cache writer runs an encoder over the images of a training config, read as `fit` reads it
    ("training", ["captioning.training", "captioning.data.features.writer"]),
    ("api", ["captioning.api"]),
    ("commands", ["captioning.cli", "captioning.web"]),
]

# The inference side: captioning without Lightning. Its modules import no LIGHTNING module,
# anywhere (lazy imports included), nor a module off this side that imports one, however indirectly.
INFERENCE: list[str] = [
    "captioning.__init__",
    "captioning.errors",
    "captioning.registry",
    "captioning.checked",
    "captioning.compat",
    "captioning.vocab",
    "captioning.tokenizers",
    "captioning.files",
    "captioning.common",
    "captioning.cuda_graphs",
    "captioning.plugins",
    "captioning.data",
    "captioning.metrics",
    "captioning.viz",
    "captioning.models",
    "captioning.decoding",
    "captioning.fast",
    "captioning.storage",
    "captioning.export",
    "captioning.evaluation",
    "captioning.api",
    "captioning.web",
]
LIGHTNING: list[str] = ["lightning", "pytorch_lightning", "lightning_fabric", "captioning.training"]

# Training-side modules in the folders of the inference side, each with its reason: they may import
# Lightning, and the inference side may not import them.
TRAINING_SIDE: dict[str, str] = {
    "captioning.data.datamodule": "the LightningDataModule",
    "captioning.data.sampling": "the training loader whose position Lightning saves in checkpoints and restores",
    "captioning.data.features.writer": "feature extraction reads its training config through LightningCLI",
}


@dataclass(frozen=True)
class Rules:
    """The tables above, or a test's own."""

    layers: list[tuple[str, list[str]]]
    inference: list[str]
    lightning: list[str]
    training_side: dict[str, str]


RULES = Rules(LAYERS, INFERENCE, LIGHTNING, TRAINING_SIDE)


@dataclass(frozen=True)
class Import:
    """One import statement: ``importer`` imports ``imported`` (a module of the package, or the
    top-level name of a module outside it: ``torch``, ``lightning``) at ``path``:``line``."""

    importer: str
    imported: str
    path: Path
    line: int


class Package:
    """The modules of ``root/name`` and their import statements."""

    def __init__(self, name: str = "captioning", root: Path = ROOT):
        self.name, self.root = name, root
        self.files = module_names(root / name, name)
        self.imports = {module: imports_in(module, path, self.files, name) for module, path in self.files.items()}

    def inside(self, module: str) -> bool:
        return module == self.name or module.startswith(self.name + ".")

    def graph(self) -> dict[str, set[str]]:
        """Module -> the package's modules it imports."""
        return {
            module: {i.imported for i in found if self.inside(i.imported)} for module, found in self.imports.items()
        }

    def where(self, module: str) -> str:
        return str(self.files[module].relative_to(self.root))

    def matching(self, module: str, names) -> str | None:
        """The longest of ``names`` that covers ``module`` (see the module's docstring), or None."""
        if module == self.name:
            own = f"{self.name}.__init__"
            return own if own in names else None
        return max((n for n in names if module == n or module.startswith(n + ".")), key=len, default=None)


def module_names(package_dir: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of the package."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join([package, *parts])] = path
    return names


def imports_in(name: str, path: Path, modules: dict[str, Path], package: str) -> list[Import]:
    """Every import statement of module ``name``, in the order of the file (``name`` itself left out)."""
    is_package = path.name == "__init__.py"
    found = []
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
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target == package or target.startswith(package + "."):
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]  # `import captioning.a.b` of a name inside a module
                if target in modules and target != name:
                    found.append(Import(name, target, path, node.lineno))
            else:
                found.append(Import(name, target.split(".")[0], path, node.lineno))
    return sorted(found, key=lambda i: i.line)


def import_graph(package: str = "captioning", root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    return Package(package, root).graph()


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


def layer_violations(package: Package, rules: Rules = RULES) -> list[str]:
    """One line per module in no layer and per import of a module of a higher layer."""
    placed = {name: i for i, (_, names) in enumerate(rules.layers) for name in names}

    def layer(module: str) -> int | None:
        name = package.matching(module, placed)
        return None if name is None else placed[name]

    problems = []
    for module, found in sorted(package.imports.items()):
        own = layer(module)
        if own is None:
            problems.append(
                f"{package.where(module)}: {module} is in no layer (place it in LAYERS, tools/dev/check_imports.py)"
            )
            continue
        for i in found:
            theirs = layer(i.imported) if package.inside(i.imported) else None
            if theirs is not None and theirs > own:
                problems.append(
                    f"{package.where(module)}:{i.line}: {module} -> {i.imported} "
                    f"(layer {rules.layers[own][0]} imports the higher layer {rules.layers[theirs][0]})"
                )
    return problems


def lightning_imports(package: Package, rules: Rules = RULES) -> list[str]:
    """One line per import of the inference side that brings in Lightning: of a LIGHTNING module
    itself, or of a module off the inference side that imports one (the chain is shown)."""

    def is_lightning(module: str) -> bool:
        return package.matching(module, rules.lightning) is not None

    def on_inference_side(module: str) -> bool:
        return (
            package.matching(module, rules.inference) is not None
            and package.matching(module, rules.training_side) is None
        )

    def chain_to_lightning(start: str) -> list[str] | None:
        """The shortest chain of imports from ``start`` to a LIGHTNING module, or None."""
        before, queue = {start: None}, deque([start])
        while queue:
            module = queue.popleft()
            for i in package.imports.get(module, ()):
                if i.imported in before:
                    continue
                before[i.imported] = module
                if is_lightning(i.imported):
                    chain = [i.imported]
                    while chain[-1] != start:
                        chain.append(before[chain[-1]])
                    return chain[::-1]
                if package.inside(i.imported):
                    queue.append(i.imported)
        return None

    problems = []
    for module, found in sorted(package.imports.items()):
        if not on_inference_side(module):
            continue
        for i in found:
            at = f"{package.where(module)}:{i.line}: {module} -> {i.imported}"
            if is_lightning(i.imported):
                problems.append(f"{at} (the inference side imports {package.matching(i.imported, rules.lightning)})")
            elif package.inside(i.imported) and not on_inference_side(i.imported):
                chain = chain_to_lightning(i.imported)
                if chain:
                    problems.append(f"{at} (off the inference side, and it imports Lightning: {' -> '.join(chain)})")
    return problems


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    package = Package()
    graph = package.graph()
    found = cycles(graph)
    for component in found:
        print("import cycle: " + " <-> ".join(component))
    layered, lightning = layer_violations(package), lightning_imports(package)
    for line in layered + lightning:
        print(line)
    print(
        f"{len(graph)} modules, {sum(map(len, graph.values()))} imports, {len(found)} cycle(s), "
        f"{len(layered)} layer violation(s), {len(lightning)} Lightning import(s) on the inference side"
    )
    return 1 if found or layered or lightning else 0


if __name__ == "__main__":
    sys.exit(main())
