"""tools/dev/check_architecture.py (run by `make lint`) finds a module no row of the tree names."""

from pathlib import Path

from tools.dev.check_architecture import unnamed

DOC = """# Architecture
| module | owns |
|---|---|
| `data/formats/base.py` | the base; `coco.py` beside it |
| `cli/` | `main.py`, one module per command: `train`, `caption` |
| `errors.py` | error types |
"""


def package(tmp_path: Path, *modules: str) -> Path:
    for m in modules:
        (tmp_path / "pkg" / m).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / m).write_text('"""A module."""\n')
    (tmp_path / "doc.md").write_text(DOC)
    return tmp_path / "pkg"


def test_every_module_named_by_path_name_or_stem(tmp_path):
    pkg = package(
        tmp_path,
        "__init__.py",
        "errors.py",
        "data/formats/__init__.py",
        "data/formats/base.py",
        "data/formats/coco.py",
        "cli/main.py",
        "cli/train.py",
        "cli/caption.py",
    )
    assert unnamed(tmp_path / "doc.md", pkg) == []


def test_a_module_no_row_names_is_listed(tmp_path):
    pkg = package(
        tmp_path, "errors.py", "cli/train.py", "cli/export.py", "data/formats/folder.py", "vocab.py", "metrics/coco.py"
    )
    # coco.py is named, but in data/formats/'s row, not for metrics/
    assert unnamed(tmp_path / "doc.md", pkg) == [
        "cli/export.py",
        "data/formats/folder.py",
        "metrics/coco.py",
        "vocab.py",
    ]
