"""pyproject.toml's dependencies: every floor stands at a release the code runs on (security fixes, the
releases ``make test-floors`` found: it installs every floor and runs tools/dev/smoke.py), every package
the code imports is declared, nltk is gone, and tools/dev/floors.py pins exactly what pyproject.toml says."""

import ast
import importlib.metadata
import re
import sys

import pytest

from tests.helpers import ROOT
from tools.dev import floors

PYPROJECT = ROOT / "pyproject.toml"
# The floors that fix security problems the code relies on being fixed: weights-only torch.load (torch
# 2.6), starlette's Range-header DoS (0.49.1), python-multipart's CVE-2024-53981 (0.0.18), h11's request
# smuggling (0.16), datasets no longer running a dataset's loading script by default (2.20); and those
# an install at the floors showed: Lightning's EMAWeightAveraging (2.6), LightningCLI's jsonargparse (4.39),
# onnxruntime 1.18's numpy (1.24.2).
FLOORS = {
    "torch": "2.6",
    "starlette": "0.49.1",
    "python-multipart": "0.0.18",
    "h11": "0.16",
    "datasets": "2.20",
    "lightning": "2.6",
    "jsonargparse": "4.39",
    "numpy": "1.24.2",
}
# imported where installed, never needed: the code works without them (viz/pictures.py: colour maps
# other than the built-in ones)
OPTIONAL_UNDECLARED = {"matplotlib"}


def _declared() -> dict[str, str]:
    """Every requirement's normalised name -> its floor, the extras' included."""
    project = floors._pyproject(PYPROJECT)["project"]
    return dict(floors.floor(r) for r in floors.requirements(PYPROJECT, tuple(project["optional-dependencies"])))


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_floor_is_at_the_release_the_code_needs(package):
    declared = _declared()
    assert package in declared, f"{package} has no >= floor in pyproject.toml"
    key = floors._version_key
    assert key(declared[package]) >= key(FLOORS[package]), (
        f"{package}>={declared[package]} allows releases the code does not run on (needs {FLOORS[package]})"
    )


def _imported_modules() -> dict[str, str]:
    """Top-level modules outside the standard library that the package imports (lazy imports and
    ``importlib.import_module("name")`` included) -> one file that imports it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "captioning").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                if getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "_import_ecosystem"):
                    names = [str(node.args[0].value)]
            for name in names:
                top = name.split(".")[0]
                if top != "captioning" and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared():
    """A module imported directly is a dependency of ours, not of a dependency (h11, braceexpand):
    declared in the dependencies or an extra, under the distribution that installs it."""
    declared = _declared()
    owners = importlib.metadata.packages_distributions()
    modules = _imported_modules()
    assert {"torch", "h11", "braceexpand", "python_multipart"} <= set(modules)  # the scan sees lazy imports
    problems = []
    for module, where in sorted(modules.items()):
        if module in OPTIONAL_UNDECLARED:
            continue
        distributions = {floors.normalise(d) for d in owners.get(module, [])}
        if not distributions:
            problems.append(f"{module} ({where}): not installed here, so its distribution is unknown")
        elif not distributions & set(declared):
            problems.append(f"{module} ({where}): its distribution {sorted(distributions)} is not in pyproject.toml")
    assert not problems, "\n".join(problems)


def test_nltk_is_neither_declared_nor_imported():
    assert "nltk" not in _declared() and "nltk" not in _imported_modules()


def test_the_floors_tool_pins_every_dependency_from_pyproject(tmp_path):
    project = floors._pyproject(PYPROJECT)["project"]
    pins = floors.constraints(("web", "onnx"), ("torch", "torchvision"))
    names = [p.split("==")[0] for p in pins]
    expected = [floors.floor(r)[0] for r in project["dependencies"] + project["optional-dependencies"]["web"]]
    expected += [floors.floor(r)[0] for r in project["optional-dependencies"]["onnx"]]
    assert names == [n for n in expected if n not in ("torch", "torchvision")]
    assert "jsonargparse==" + _declared()["jsonargparse"] in pins  # the extras of a requirement dropped
    assert all(re.fullmatch(r"[a-z0-9-]+==[0-9][0-9.]*", p) for p in pins), pins


def test_the_floors_tool_refuses_a_requirement_without_one_floor(tmp_path):
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[project]\nname = "x"\ndependencies = ["numpy>=1.24", "pillow"]\n')
    with pytest.raises(ValueError, match="'pillow': expected one '>=' floor"):
        floors.constraints(pyproject=bad)
    bad.write_text('[project]\nname = "x"\ndependencies = ["uvicorn>=0.30,<0.55"]\n')
    assert floors.constraints(pyproject=bad) == ["uvicorn==0.30"]  # a cap beside the floor is fine
    with pytest.raises(ValueError, match="no extra 'gpu'"):
        floors.requirements(bad, ("gpu",))
