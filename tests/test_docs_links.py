"""The documentation's relative links resolve, and the README stays a front page.

For README.md, README.zh-CN.md and every Markdown file under docs/, each relative link or image target
(``[text](path)``, ``![alt](path)``) must name an existing file or folder, relative to the file
that links it. Web addresses (http, https), ``mailto:`` and in-page anchors (``#section``) are not
checked; a path's ``#fragment`` is dropped before the check.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 400

#: [text](target) and ![alt](target); the target may carry a "title" after a space
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # http:, https:, mailto:, ...


def markdown_files() -> list[Path]:
    return [README, ROOT / "README.zh-CN.md", *sorted((ROOT / "docs").rglob("*.md"))]


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link and image outside fenced code blocks and inline code."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # `[x](y)` in inline code is not a link
        found += [(number, m.group(1)) for m in LINK.finditer(line)]
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """'FILE:LINE: target' of each relative link of ``path`` that names nothing (FILE relative to ``root``)."""
    broken = []
    for number, target in links(path.read_text(encoding="utf-8")):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        relative = unquote(target.split("#", 1)[0])
        if not relative:
            continue
        if not (path.parent / relative).exists():
            broken.append(f"{path.relative_to(root)}:{number}: {target}")
    return broken


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
    assert [t for _, t in links(text)] == [
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
    assert broken_links(page, root=tmp_path) == ["page.md:1: missing.md#top", "page.md:1: img/none.png"]


def test_docs_exist():
    names = {p.relative_to(ROOT).as_posix() for p in markdown_files()}
    assert {"README.md", "docs/WEB.md"} <= names


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    broken = broken_links(path)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_a_front_page():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move the rest to docs/"
