"""The checks `make lint` runs on the repository (tools/dev/check_*.py) catch what they are for: each is
given a small bad input here (a package, a file, a docs tree) and must report it. `make lint` runs them
on the repository itself."""

import re
import shutil

import pytest

from tests.helpers import ROOT
from tools.dev import check_docs, check_imports, check_python_floor


# ---------------------------------------------------------------------- check_imports
def write_package(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_import_cycle_checker_finds_a_cycle(tmp_path):
    write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "",
            "pkg/a.py": "from pkg.sub import b\n",
            "pkg/sub/b.py": "def f():\n    from pkg import a  # a lazy import counts too\n",
            "pkg/c.py": "import pkg.a\n",
        },
    )
    graph = check_imports.import_graph("pkg", tmp_path)
    assert check_imports.cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_layer_checker_reports_imports_of_higher_layers_lazy_ones_too(tmp_path):
    write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "import os\n\n\ndef f():\n    from pkg.high import g  # lazy\n    return g\n",
            "pkg/mid/__init__.py": "",
            "pkg/mid/part.py": "from pkg import low\nfrom ..high import g\n",
            "pkg/high.py": "from pkg.low import f\nfrom pkg.mid import part\n\n\ndef g():\n    return f\n",
            "pkg/stray.py": "",
        },
    )
    rules = check_imports.Rules(
        layers=[("ground", ["pkg.__init__", "pkg.low"]), ("middle", ["pkg.mid"]), ("top", ["pkg.high"])],
        inference=[],
        lightning=[],
        training_side={},
    )
    problems = check_imports.layer_violations(check_imports.Package("pkg", tmp_path), rules)
    assert problems == [
        "pkg/low.py:5: pkg.low -> pkg.high (layer ground imports the higher layer top)",
        "pkg/mid/part.py:2: pkg.mid.part -> pkg.high (layer middle imports the higher layer top)",
        "pkg/stray.py: pkg.stray is in no layer (place it in LAYERS, tools/dev/check_imports.py)",
    ]


def test_lightning_checker_follows_imports_off_the_inference_side(tmp_path):
    write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/infer/__init__.py": "",
            "pkg/infer/plain.py": "import torch\nfrom pkg.infer import dm\n",  # dm is training-side: brings Lightning
            "pkg/infer/dm.py": "import lightning as L\n",  # allowed: listed as training-side
            "pkg/infer/lazy.py": "def f():\n    import lightning.pytorch as pl\n    return pl\n",
            "pkg/infer/tools.py": "from pkg import helpers\nfrom pkg.train import loop\n",
            "pkg/helpers.py": "import os\n",  # off the inference side, but Lightning-free: fine
            "pkg/cmd.py": "from pkg.train import loop\n",
            "pkg/train/__init__.py": "",
            "pkg/train/loop.py": "import pytorch_lightning\n",
        },
    )
    rules = check_imports.Rules(
        layers=[],
        inference=["pkg.__init__", "pkg.infer"],
        lightning=["lightning", "pytorch_lightning", "pkg.train"],
        training_side={"pkg.infer.dm": "a LightningDataModule"},
    )
    problems = check_imports.lightning_imports(check_imports.Package("pkg", tmp_path), rules)
    assert problems == [
        "pkg/infer/lazy.py:2: pkg.infer.lazy -> lightning (the inference side imports lightning)",
        "pkg/infer/plain.py:2: pkg.infer.plain -> pkg.infer.dm (off the inference side, and it imports Lightning: "
        "pkg.infer.dm -> lightning)",
        "pkg/infer/tools.py:2: pkg.infer.tools -> pkg.train.loop (the inference side imports pkg.train)",
    ]


def test_check_imports_command_prints_each_problem_and_exits_1(tmp_path, monkeypatch, capsys):
    write_package(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import pkg.a\n"})
    package = check_imports.Package("pkg", tmp_path)
    monkeypatch.setattr(check_imports, "Package", lambda: package)  # what main() reads
    assert check_imports.main([]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "import cycle: pkg.a <-> pkg.b" in lines
    assert "pkg/a.py: pkg.a is in no layer (place it in LAYERS, tools/dev/check_imports.py)" in lines
    assert lines[-1].startswith("3 modules, 2 imports, 1 cycle(s), 3 layer violation(s)")


# ---------------------------------------------------------------------- check_python_floor
@pytest.mark.parametrize("line", ["import tomllib", "from typing import Self", "type Alias = int"])
def test_the_floor_check_catches_newer_code(tmp_path, line, capsys):
    """Each line needs Python 3.11 or 3.12: the check fails on it (while the floor is below them)."""
    pytest.importorskip("vermin", reason="the dev extra is not installed: pip install -e '.[dev]'")
    path = tmp_path / "newer.py"
    path.write_text(line + "\n")
    assert check_python_floor.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "newer.py" in out and f"a newer Python than {check_python_floor.floor()}" in out


def test_the_floor_is_read_from_pyproject(tmp_path):
    assert check_python_floor.floor() == "3.10"  # pyproject.toml's requires-python
    (tmp_path / "pyproject.toml").write_text('[project]\nrequires-python = "~=3.9"\n')
    assert check_python_floor.floor(tmp_path / "pyproject.toml") is None


# ---------------------------------------------------------------------- check_docs
def test_link_pattern():
    text = "\n".join(
        [
            'See [the guide](docs/TRAINING.md#configs) and ![a picture](assets/x.png "title").',
            "A [web link](https://example.com), [mail](mailto:a@b.c) and [an anchor](#results).",
            "`[not a link](nowhere.md)` in inline code.",
            "```",
            "[inside a code block](nowhere.md)",
            "```",
        ]
    )
    assert [t for _, t in check_docs.links(text)] == [
        "docs/TRAINING.md#configs",
        "assets/x.png",
        "https://example.com",
        "mailto:a@b.c",
        "#results",
    ]


def test_a_broken_link_is_reported(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# there\n")
    page.write_text("[ok](there.md#top) [ok too](./) [gone](missing.md#top) ![gone](img/none.png)\n")
    assert check_docs.broken_links(page, root=tmp_path) == ["page.md:1: missing.md#top", "page.md:1: img/none.png"]


@pytest.mark.parametrize(
    "line",
    [
        "Seed 0's Chinese runs were trained last session, seed 1's at commit 6af4865.",
        "the previous session's estimate of 103 seeds",
        "on this session's machine one core trained 2.9 steps a second",
        "| **the demo's** (commit f78680b) | 2 | 0.932 |",
        "| 0ccee94's | 1 | 0.915 |",
        "Before (6af4865) and after (3006c9f) this work",
        "The performance goal of the GPU step (issue 15: 4,500 pairs a second)",
        "other sessions' tests still ran",
    ],
)
def test_history_is_recognised(line):
    assert check_docs.history_lines(line), line


@pytest.mark.parametrize(
    "line",
    [
        "one session call per step (onnxruntime)",
        "with checkouts of clips/pattern at d25511f, LisaAnne/Hallucination at 6e4d33c",
        "CIDEr 6.26 | 1,865 steps | 0.984 |",
        "`tests/fixtures/feature_cache_6af4865` is an old cache",
    ],
)
def test_the_manuals_own_words_pass(line):
    assert not check_docs.history_lines(line), line


@pytest.fixture
def docs_tree(tmp_path):
    """The repository with copies of its docs and project files to spoil (the rest linked, for the docs'
    links to name). The tests count the problems spoiling adds: whether the repository's own docs pass
    is `make lint`'s to say."""
    copied = ("README.md", "pyproject.toml", "LICENSE", "CITATION.cff", "CHANGELOG.md", "docs")
    for source in ROOT.iterdir():
        if source.name in copied:
            (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / source.name)
        elif source.name not in (".git", ".venv"):
            (tmp_path / source.name).symlink_to(source)
    return tmp_path


def project_version() -> str:
    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def spoil(path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_the_docs_check_reports_each_kind_of_problem(docs_tree):
    before = {what: check(docs_tree) for what, check in check_docs.CHECKS.items()}
    readme, web, evaluation = (
        docs_tree / "README.md",
        docs_tree / "docs" / "WEB.md",
        docs_tree / "docs" / "EVALUATION.md",
    )
    # 200 broken links and 200 lines of history, past the 400 lines of a front page
    readme.write_text(readme.read_text() + "[gone](docs/NOWHERE.md)\nAs of commit 1234567 it was slower.\n" * 200)
    spoil(web, "| `--max-pixels` | `", "| `--max-pixels` | `1")
    spoil(evaluation.parent / "TRAINING.md", "--config configs/own_small_cnn.yaml", "--config configs/own_big.yaml")
    table = evaluation.read_text().split("## Decoding options", 1)[1].split("\n\n", 3)[2]
    row = next(line for line in table.splitlines() if line.startswith("| `--"))
    spoil(evaluation, row, row + "\n| `--no-such-flag` | x | x |")
    spoil(docs_tree / "CITATION.cff", "\nversion: ", "\nversion: 9")

    # the problems the spoiling added (those of the copy before it are make lint's to report)
    found = {what: [p for p in check(docs_tree) if p not in before[what]] for what, check in check_docs.CHECKS.items()}
    assert len(found["links"]) == 200 and found["links"][0].startswith("README.md:")
    assert "docs/NOWHERE.md" in found["links"][0]
    assert found["README"] == [
        f"README.md: {len(readme.read_text().splitlines())} lines; a front page has at most 400: move the rest to docs/"
    ]
    assert len(found["history"]) == 200 and "a commit of this repository" in found["history"][0]
    quotes = "\n".join(found["quotes"])
    assert "docs/WEB.md: --max-pixels's default is" in quotes
    assert "docs/EVALUATION.md: the decoding-options table lists flags `caption` lacks: ['--no-such-flag']" in quotes
    assert "docs/TRAINING.md: 'Your own images' should train configs/own_small_cnn.yaml" in quotes
    assert len(found["quotes"]) == 5  # the pixel limit, the flag for each of three commands, the config
    [project] = found["project files"]
    assert project == f"CITATION.cff: version '9{project_version()}'; pyproject.toml's is '{project_version()}'"


def test_the_docs_check_command_exits_1_on_a_problem(docs_tree, monkeypatch, capsys):
    links = len(check_docs.CHECKS["links"](docs_tree))
    spoil(docs_tree / "docs" / "WEB.md", "](", "](missing/")
    monkeypatch.setattr(check_docs, "ROOT", docs_tree)  # what main() reads
    assert check_docs.main([]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("docs/WEB.md:") and "missing/" in line for line in out), out
    assert out[-1].startswith(f"{links + 1} links problem(s), "), out[-1]
