"""The notebooks of examples/ and examples/zh/: each .ipynb is its jupytext source, the Chinese ones run the
English ones' code in Chinese, each explains its mechanisms with equations, and the helpers they share
(examples/notebook_tools.py) work on this version of the package. Executing them is `make notebooks`
(CI runs it); here nothing trains beyond a few steps."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

jupytext = pytest.importorskip("jupytext", reason="the dev extra is not installed: pip install -e '.[dev]'")
nbformat = pytest.importorskip("nbformat", reason="the dev extra is not installed: pip install -e '.[dev]'")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
sys.path.insert(0, str(EXAMPLES))
import run_notebooks  # noqa: E402

ENGLISH = sorted(EXAMPLES.glob("[0-9]_*.py"))
CHINESE = sorted((EXAMPLES / "zh").glob("[0-9]_*.py"))


def code_cells(source: Path) -> list[str]:
    """The notebook's code cells, comments and the parameters cell's values aside."""
    cells = []
    for cell in jupytext.read(source).cells:
        if cell.cell_type != "code":
            continue
        code = ast.unparse(ast.parse(cell.source))  # comments dropped, layout normalised
        if "parameters" in cell.metadata.get("tags", []):
            code = re.sub(r"=\s*.+", "= ...", code)
        cells.append(code)
    return cells


def test_four_notebooks_in_each_language():
    assert [p.name for p in ENGLISH] == [p.name for p in CHINESE]
    assert len(ENGLISH) == 4


def test_each_ipynb_is_its_source():
    assert run_notebooks.check() == []


def test_a_stale_ipynb_is_found(tmp_path, monkeypatch):
    for source in ENGLISH[:1]:
        (tmp_path / source.name).write_text(source.read_text().replace("STEPS = ", "STEPS = 1 + "))
        nbformat.write(run_notebooks.notebook_of(source), tmp_path / source.with_suffix(".ipynb").name)
    monkeypatch.setattr(run_notebooks, "EXAMPLES", tmp_path)
    monkeypatch.setattr(run_notebooks, "REPO", tmp_path)
    [problem] = run_notebooks.check()
    assert "differs from" in problem and "--sync" in problem


@pytest.mark.parametrize("name", [p.name for p in ENGLISH])
def test_the_chinese_notebook_runs_the_english_code(name):
    """Only the Markdown, the comments and the parameters (LANGUAGE = "zh") differ."""
    assert code_cells(EXAMPLES / "zh" / name) == code_cells(EXAMPLES / name)
    params = {
        lang: next(c.source for c in jupytext.read(folder / name).cells if "parameters" in c.metadata.get("tags", []))
        for lang, folder in (("en", EXAMPLES), ("zh", EXAMPLES / "zh"))
    }
    assert 'LANGUAGE = "en"' in params["en"] and 'LANGUAGE = "zh"' in params["zh"]


@pytest.mark.parametrize("source", ENGLISH + CHINESE, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_each_notebook_explains_with_equations(source):
    markdown = "\n".join(c.source for c in jupytext.read(source).cells if c.cell_type == "markdown")
    equations = re.findall(r"\$\$.+?\$\$|\$[^$\n]+\$", markdown, re.DOTALL)  # displayed and inline LaTeX
    assert len(equations) >= 8 and "$$" in markdown, len(equations)
    if source.parent.name == "zh":
        chinese = sum("\u4e00" <= ch <= "\u9fff" for ch in markdown)
        assert chinese > 300, chinese


def test_with_steps_sets_the_parameters_cell():
    notebook = run_notebooks.with_steps(run_notebooks.notebook_of(ENGLISH[0]), 7)
    [cell] = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert "STEPS = 7" in cell.source


# ---------------------------------------------------------------------- the shared helpers
@pytest.fixture(scope="module")
def tools():
    spec = importlib.util.spec_from_file_location("notebook_tools", EXAMPLES / "notebook_tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_names_what_this_version_lacks(tools):
    assert tools.missing() is None and tools.missing(score="dot") is None
    assert tools.missing(window="local") is None and tools.missing(kind="transformer") is None
    problem = tools.missing(score="no_such_score")
    assert problem and "no_such_score" in problem and "\n" not in problem
    assert "no_such_kind" in tools.missing(kind="no_such_kind")


def test_train_skips_a_missing_mechanism_and_says_why(tools, capsys):
    assert tools.train("nothing", 1, score="no_such_score") is None
    assert "skipped nothing" in capsys.readouterr().out
    assert tools.train("nothing", 1, "zh", config="no_such_config.yaml") is None
    assert "跳过 nothing" in capsys.readouterr().out


def test_pictures_as_bytes(tools, tiny_checkpoint, tiny_shapes):
    from captioning.api import Captioner

    captioner = Captioner.from_checkpoint(tiny_checkpoint, device="cpu")
    image = str(sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0])
    [out] = captioner([image], return_attention=True)
    shown = tools.gif(captioner, image, out)
    assert shown.data[:6] in (b"GIF87a", b"GIF89a")
    assert tools.grid(captioner, image, out).data[:8] == b"\x89PNG\r\n\x1a\n"
    values = np.asarray(out["attention"]).reshape(len(out["attention"]), -1)
    picture = tools.matrix(values, out["tokens"])
    assert picture.data[:8] == b"\x89PNG\r\n\x1a\n"


def test_render_returning_bytes_is_taken_as_it_is(tools):
    class Renders:
        def render(self, image, result, path, format="gif", **kwargs):
            return b"GIF89a-made-in-memory"

    assert tools.picture_bytes(Renders(), "x.png", {}) == b"GIF89a-made-in-memory"
