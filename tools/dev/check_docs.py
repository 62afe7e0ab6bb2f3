"""Check the documentation against the repository and the program. Prints each problem as
``FILE[:LINE]: what`` and exits 1 if there is one.

    python -m tools.dev.check_docs

- links: each relative link or image of README.md, README.zh-CN.md and docs/**/*.md names an existing file or
  folder (web addresses, ``mailto:`` and in-page anchors are not checked; a ``#fragment`` is dropped);
- README: a front page of at most 400 lines;
- history: no development history in those files (sessions, commit hashes, issue numbers);
- quotes: the figures and examples the docs quote from the code (docs/WEB.md's pixel limit, answer
  and model names, docs/EVALUATION.md's decoding flags, docs/TRAINING.md's own-images config);
- project files: the licence pyproject.toml names is LICENSE's, its version CITATION.cff's, and
  CHANGELOG.md has a section for it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 400

#: [text](target) and ![alt](target); the target may carry a "title" after a space
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # http:, https:, mailto:, ...

#: what a manual does not say (history lives in git; a figure names its command and machine instead);
#: external repositories' versions ("clips/pattern at d25511f") are provenance of the code a metric
#: reproduces, and stay
HISTORY = {
    "a development session": re.compile(
        r"\b(this|last|previous|another|other|earlier|later|next|that) sessions?\b|\bsessions?'s?\b(?! call)",
        re.IGNORECASE,
    ),
    "a commit of this repository": re.compile(r"\b(?:at |as of |of |in )?commits? [0-9a-f]{7,40}\b", re.IGNORECASE),
    "a row or figure keyed by a commit": re.compile(
        r"(?:\(|\| *)[0-9a-f]{7,40}(?:'s)?(?: *\||\))|\b[0-9a-f]{7,40}'s\b"
    ),
    "an issue number": re.compile(r"\bissue #?\d+\b", re.IGNORECASE),
    "a turn of the work": re.compile(r"\b(this|last|previous) turn\b", re.IGNORECASE),
}


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [
        root / "README.md",
        *([root / "README.zh-CN.md"] if (root / "README.zh-CN.md").exists() else []),
        *sorted((root / "docs").rglob("*.md")),
    ]


def name(path: Path, root: Path = ROOT) -> str:
    return path.relative_to(root).as_posix()


# ---------------------------------------------------------------------- links
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
        if relative and not (path.parent / relative).exists():
            broken.append(f"{name(path, root)}:{number}: {target}")
    return broken


def link_problems(root: Path = ROOT) -> list[str]:
    files = markdown_files(root)
    missing = [f for f in ("README.md", "docs/WEB.md") if f not in {name(p, root) for p in files}]
    return [f"{f}: not found (the docs are read from {root})" for f in missing] + [
        f"{problem} (a relative link that names nothing)" for path in files for problem in broken_links(path, root)
    ]


def readme_problems(root: Path = ROOT) -> list[str]:
    lines = len((root / "README.md").read_text(encoding="utf-8").splitlines())
    if lines <= README_MAX_LINES:
        return []
    return [f"README.md: {lines} lines; a front page has at most {README_MAX_LINES}: move the rest to docs/"]


# ---------------------------------------------------------------------- development history
def history_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, line) of each line that tells development history."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in HISTORY.items():
            if pattern.search(line):
                found.append((number, what, line.strip()))
    return found


def history_problems(root: Path = ROOT) -> list[str]:
    return [
        f"{name(path, root)}:{number}: {what} (history lives in git): {line[:120]}"
        for path in markdown_files(root)
        for number, what, line in history_lines(path.read_text(encoding="utf-8"))
    ]


# ---------------------------------------------------------------------- what the docs quote
def help_text(command: str) -> str:
    """``captioning COMMAND --help`` on one line."""
    from captioning.cli.main import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return " ".join(sub.format_help().split())


def one(found: list, where: str, what: str, problems: list[str]):
    """The one match of ``found``, or None with a problem noted."""
    if len(found) != 1:
        problems.append(f"{where}: expected one {what}, found {len(found)}")
        return None
    return found[0]


def web_problems(root: Path = ROOT) -> list[str]:
    """docs/WEB.md against the server: the pixel limit, the answer's settings and training data, and
    the names two unnamed models get."""
    from types import SimpleNamespace

    from captioning.web.served import _file_names
    from captioning.web.server import DEFAULT_MAX_PIXELS, _name_models
    from captioning.web.settings import Settings

    web, where, problems = (root / "docs" / "WEB.md").read_text(), "docs/WEB.md", []
    table = one(re.findall(r"^\| `--max-pixels` \| `(\d+)` \|", web, flags=re.M), where, "--max-pixels row", problems)
    if table is not None and int(table) != DEFAULT_MAX_PIXELS:
        problems.append(f"{where}: --max-pixels's default is {DEFAULT_MAX_PIXELS}, the table says {table}")
    quoted = re.findall(r"(\d+) (?:megapixels|MP)\b", web)
    if not quoted or any(int(q) * 1_000_000 != DEFAULT_MAX_PIXELS for q in quoted):
        problems.append(f"{where}: the megapixels quoted {quoted} are not the server's {DEFAULT_MAX_PIXELS:,} pixels")

    # the answer's `settings` example: fields of Settings().as_dict(), in its order, with its values
    # (the request sets num_beams 3, as the example's curl does)
    example = one(re.findall(r'"settings": \{(.*?)\}', web, flags=re.S), where, '"settings" example', problems)
    if example is not None:
        shown, expected = re.findall(r'"(\w+)": (\w+|[\d.]+)', example), Settings(num_beams=3).as_dict()
        unknown = [k for k, _ in shown if k not in expected]
        if unknown:
            problems.append(f"{where}: the settings example shows fields the server's settings lack: {unknown}")
        elif [k for k, _ in shown] != [k for k in expected if k in dict(shown)]:
            problems.append(f"{where}: the settings example's fields are not in the order of Settings.as_dict()")
        elif {k: json.loads(v) for k, v in shown} != {k: expected[k] for k, _ in shown}:
            problems.append(f"{where}: the settings example's values are not Settings(num_beams=3)'s: {expected}")
        if not {"num_beam_groups", "diversity_penalty"} <= dict(shown).keys():
            problems.append(f"{where}: the settings example lacks num_beam_groups and diversity_penalty")

    shown = one(re.findall(r'"training_data": "([^"]+)"', web), where, '"training_data" example', problems)
    expected = _file_names("outputs/demo/data/dataset_shapes.json")
    if shown is not None and shown != expected:
        problems.append(f"{where}: training_data is shown as {shown!r}; the server says {expected!r}")

    models = [SimpleNamespace(name="", description={"attention": "soft", "encoder": "small_cnn"}) for _ in range(2)]
    _name_models(models, [None, None])
    names = [m.name for m in models]
    if names != ["soft-small_cnn", "soft-small_cnn-2"] or not all(f"`{n}`" in web for n in names):
        problems.append(f"{where}: two unnamed soft small_cnn models are named {names} by the server; quote those")
    return problems


def evaluation_problems(root: Path = ROOT) -> list[str]:
    """Every flag of docs/EVALUATION.md's decoding-options table is a flag of caption, attend and evaluate."""
    where = "docs/EVALUATION.md"
    parts = (root / "docs" / "EVALUATION.md").read_text().split("## Decoding options", 1)
    if len(parts) < 2 or len(parts[1].split("\n\n", 3)) < 3:
        return [f"{where}: no '## Decoding options' section with its table"]
    flags = re.findall(r"^\| `(--[\w-]+)", parts[1].split("\n\n", 3)[2], flags=re.M)
    if len(flags) <= 10:
        return [f"{where}: the decoding-options table lists {len(flags)} flags; expected more than 10"]
    problems = []
    for command in ("caption", "attend", "evaluate"):
        text = help_text(command)
        missing = [f for f in flags if f"{f} " not in text and not text.endswith(f)]
        if missing:
            problems.append(f"{where}: the decoding-options table lists flags `{command}` lacks: {missing}")
    return problems


def training_problems(root: Path = ROOT) -> list[str]:
    """docs/TRAINING.md's "Your own images" commands name the small config, which exists."""
    where = "docs/TRAINING.md"
    text = (root / "docs" / "TRAINING.md").read_text()
    section = text.split("Your own images", 1)[1].split("\n### ", 1)[0] if "Your own images" in text else ""
    configs = re.findall(r"--config (configs/\S+\.yaml)", section)
    if configs != ["configs/own_small_cnn.yaml"] or not (root / configs[0]).is_file():
        return [
            f"{where}: 'Your own images' should train configs/own_small_cnn.yaml (an existing file); it names {configs}"
        ]
    return []


# ---------------------------------------------------------------------- the project's own papers
def project_problems(root: Path = ROOT) -> list[str]:
    """The licence pyproject.toml names is LICENSE's; its version is CITATION.cff's (which cites the
    paper) and has a section in CHANGELOG.md (tags: vX.Y.Z)."""
    import yaml

    pyproject = (root / "pyproject.toml").read_text()

    def field(key: str) -> str | None:
        match = re.search(rf'^{key} = (?:\{{ text = )?"([^"]+)"', pyproject, re.MULTILINE)
        return match.group(1) if match else None

    problems, version = [], field("version")
    licence = (root / "LICENSE").read_text()
    if field("license") != "MIT" or not (
        licence.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in licence
    ):
        problems.append(
            f"LICENSE: pyproject.toml names the licence {field('license')!r}; LICENSE should be its text (MIT)"
        )
    citation = yaml.safe_load((root / "CITATION.cff").read_text())
    paper = citation.get("preferred-citation", {})
    if (citation.get("cff-version"), citation.get("type"), citation.get("license")) != ("1.2.0", "software", "MIT"):
        problems.append("CITATION.cff: expected cff-version 1.2.0, type software, license MIT")
    if citation.get("version") != version:
        problems.append(f"CITATION.cff: version {citation.get('version')!r}; pyproject.toml's is {version!r}")
    authors = [a.get("family-names") for a in paper.get("authors", [])][:2]
    if not (str(paper.get("title", "")).startswith("Show, Attend and Tell") and paper.get("year") == 2015):
        problems.append("CITATION.cff: the preferred citation is not the paper (Show, Attend and Tell, 2015)")
    elif authors != ["Xu", "Ba"]:
        problems.append(f"CITATION.cff: the paper's first authors are Xu and Ba, not {authors}")
    changelog = (root / "CHANGELOG.md").read_text()
    if not (f"## [{version}]" in changelog and "## [Unreleased]" in changelog and "vMAJOR.MINOR.PATCH" in changelog):
        problems.append(f"CHANGELOG.md: expected sections '## [Unreleased]' and '## [{version}]' and the tag form")
    return problems


def quote_problems(root: Path = ROOT) -> list[str]:
    return web_problems(root) + evaluation_problems(root) + training_problems(root)


CHECKS = {
    "links": link_problems,
    "README": readme_problems,
    "history": history_problems,
    "quotes": quote_problems,
    "project files": project_problems,
}


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    found = {what: check(ROOT) for what, check in CHECKS.items()}
    for problems in found.values():
        for problem in problems:
            print(problem)
    print(", ".join(f"{len(problems)} {what} problem(s)" for what, problems in found.items()))
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
