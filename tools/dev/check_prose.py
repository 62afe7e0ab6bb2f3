"""Docstrings a reader can parse: module docstrings of at most 20 lines, no sentence over 60 words.

    python -m tools.dev.check_prose                    # the captioning/ package
    python -m tools.dev.check_prose captioning/metrics tools/dev/smoke.py
    python -m tools.dev.check_prose --stats            # the counts, and the package's docstring share

Every module, class and function docstring is split into sentences (the rules: :func:`sentences`).
Each module docstring over ``--max-lines`` lines and each sentence over ``--max-words`` words is
printed as ``path:line: ...``; the exit status is 1 if there is any. Derivations, measurements and
histories belong in docs/ (docs/CONTRIBUTING.md, "Docstrings").
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 20
MAX_WORDS = 60

#: Words whose final period does not end a sentence (lower case, with their periods).
ABBREVIATIONS = frozenset(
    "e.g. i.e. cf. vs. etc. al. approx. resp. fig. figs. eq. eqs. sec. no. nos. p. pp. vol. ch. "
    "dr. mr. ms. mrs. prof. st. jr. sr. inc. ltd. co. v. ca. min. max. incl. excl. esp.".split()
)
_CODE_SPAN = re.compile(r"``.+?``|`[^`\n]+`")
_LIST_ITEM = re.compile(r"([-*+\u2022]|\d+[.)]|\(\d+\)|[a-z][.)]|#\.)\s")
_FENCE = re.compile(r"(```|~~~)")
_TABLE_RULE = re.compile(r"[=+|-]*(===|---)[=+| -]*")
#: A sentence end: . ! or ? (with closing quotes or brackets after it), then white space.
_END = re.compile(r"[.!?][\"')\]]*(?=\s)")


@dataclass(frozen=True)
class Sentence:
    """A sentence of a docstring: the file's line it starts on, its number of words and its text."""

    line: int
    words: int
    text: str


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _units(lines: list[str], first_line: int) -> Iterator[list[tuple[int, str]]]:
    """Runs of prose lines (each with its line number) that no sentence crosses.

    A blank line, a list item ("- ", "* ", "1. ", "(a) "...), a deeper indentation after a line ending with ":"
    and a return to a shallower one (as in the "Args:" sections) each start a new run. Skipped: literal blocks,
    doctests (">>>" to the next blank line), reST tables (a rule of "=" or "-" to the next blank line) and
    fenced blocks. A literal block is the indented lines after a line ending with "::", or after a blank line
    when they are 4 columns deeper than the paragraph above (or deeper than one ending with ":").
    """
    unit: list[tuple[int, str]] = []
    code_above: int | None = None  # inside a literal block: the indentation its lines are deeper than
    fenced = doctest = table = False  # in a fenced block, a doctest, a table (the last two end at a blank line)
    sections: list[int] = []  # the indentation of the items of each "Args:"-like section open, outermost first
    prev: tuple[int, str] | None = None  # the previous prose line's indentation and text
    after_blank = False
    for number, raw in enumerate(lines, first_line):
        text = raw.strip()
        indent = _indent(raw)
        if fenced:
            fenced = not _FENCE.match(text)
            continue
        if code_above is not None:
            if not text or indent > code_above:
                continue
            code_above, after_blank = None, True  # the block ends a sentence
        if doctest or table:
            if text:
                continue
            doctest = table = False
        if not text:
            after_blank = True
            continue
        new = after_blank
        if _FENCE.match(text) or text.startswith(">>>") or _TABLE_RULE.fullmatch(text):
            fenced, doctest, table = bool(_FENCE.match(text)), text.startswith(">>>"), bool(_TABLE_RULE.fullmatch(text))
            new, prev = True, None
        elif (
            prev is not None
            and after_blank
            and (indent >= prev[0] + 4 or indent > prev[0] and prev[1].endswith(":"))
            and not _LIST_ITEM.match(text)
        ):
            code_above, new = prev[0], True  # "Usage:" (or any paragraph), a blank line, an indented command
        elif _LIST_ITEM.match(text):
            new = True
        elif prev is not None and indent > prev[0] and prev[1].endswith(":"):
            sections.append(indent)
            new = True
        elif prev is not None and indent < prev[0]:
            new = True
            sections = [s for s in sections if s <= indent]
        elif sections and indent == sections[-1]:
            new = True
        if new and unit:
            yield unit
            unit = []
        after_blank = False
        if fenced or doctest or table or code_above is not None:
            continue
        prev = (indent, text)
        marker = _LIST_ITEM.match(text)
        unit.append((number, text[marker.end() :] if marker else text))  # a marker ("1.") is not a word
        if text.endswith("::"):
            code_above = indent
    if unit:
        yield unit


def _mask(text: str) -> str:
    """``text`` with each code span's inside turned into "x" (same length), so that its periods end nothing."""
    return _CODE_SPAN.sub(lambda m: m.group(0)[0] + "x" * (len(m.group(0)) - 2) + m.group(0)[-1], text)


def _words(masked: str) -> tuple[str, ...]:
    """The words of a (masked) sentence: a code span is one word; dashes and other bare punctuation are none."""
    return tuple(w for w in masked.split() if any(c.isalnum() for c in w))


def sentences(doc: str, first_line: int = 1) -> list[Sentence]:
    """The sentences of a docstring whose first line is the file's ``first_line``.

    A sentence ends at ". ", "! " or "? " (a colon or semicolon ends none), unless the period is inside a code span
    (`x` or ``x``), ends an abbreviation ("e.g.", "i.e.", "etc.", "cf."...) or is followed by a word in lower case.
    Periods inside words ("0.5", "models.decoder", "decoder.py") are not followed by white space, so they end none.
    The end of a paragraph, a list item, an "Args:" entry, a literal block or a doctest ends a sentence too.
    """
    lines = doc.expandtabs().split("\n")
    body = [line for line in lines[1:] if line.strip()]
    margin = min((_indent(line) for line in body), default=0)
    lines = [lines[0].strip()] + [line[margin:] for line in lines[1:]]
    found = []
    for unit in _units(lines, first_line):
        text = " ".join(t for _, t in unit)
        masked = _mask(text)
        starts, offset = [], 0  # the offset in ``text`` of each line's first character
        for _, t in unit:
            starts.append(offset)
            offset += len(t) + 1
        pieces, begin = [], 0
        for m in _END.finditer(masked):
            word = masked[: m.start() + 1].split()[-1].lstrip("(\"'[").lower()
            following = masked[m.end() :].lstrip()
            if word in ABBREVIATIONS or (following and following[0].islower()):
                continue
            pieces.append((begin, m.end()))
            begin = m.end()
        pieces.append((begin, len(masked)))
        for begin, end in pieces:
            words = _words(masked[begin:end])
            if not words:
                continue
            lead = begin + len(masked[begin:end]) - len(masked[begin:end].lstrip())
            row = max(i for i, s in enumerate(starts) if s <= lead)
            found.append(Sentence(unit[row][0], len(words), " ".join(text[begin:end].split())))
    return found


def _docstrings(tree: ast.Module) -> Iterator[tuple[ast.AST, ast.Constant]]:
    """Each module, class and function of ``tree`` with a docstring, and the docstring's node."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    yield node, first.value


@dataclass
class Report:
    """What :func:`check` found in some files: the problems, and the counts ``--stats`` prints."""

    problems: list[str]
    files: int = 0
    lines: int = 0
    docstring_lines: int = 0
    long_modules: int = 0
    long_sentences: int = 0


def python_files(paths: list[Path]) -> list[Path]:
    """The .py files among ``paths`` and under its folders, sorted."""
    files = []
    for path in paths:
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def check(paths: list[Path], max_lines: int = MAX_LINES, max_words: int = MAX_WORDS) -> Report:
    """Check the docstrings of the .py files among ``paths`` (and under its folders)."""
    report = Report([])
    for path in python_files(paths):
        source = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(source, filename=str(path))
        except SyntaxError as e:
            report.problems.append(f"{path}:{e.lineno}: not Python: {e.msg}")
            continue
        report.files += 1
        report.lines += len(source.splitlines())
        for node, doc in _docstrings(tree):
            report.docstring_lines += doc.end_lineno - doc.lineno + 1
            if isinstance(node, ast.Module):
                n = len(inspect.cleandoc(doc.value).splitlines())
                if n > max_lines:
                    report.long_modules += 1
                    report.problems.append(f"{path}:{doc.lineno}: module docstring of {n} lines (at most {max_lines})")
            for s in sentences(doc.value, doc.lineno):
                if s.words > max_words:
                    report.long_sentences += 1
                    head = " ".join(s.text.split()[:12])
                    report.problems.append(
                        f'{path}:{s.line}: a sentence of {s.words} words (at most {max_words}): "{head}..."'
                    )
    report.problems.sort(key=_order)
    return report


def _order(problem: str) -> tuple[str, int]:
    path, line, _ = problem.split(":", 2)
    return path, int(line) if line.isdigit() else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.dev.check_prose", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", type=Path, help="files and folders to check (default: the captioning/ package)")
    p.add_argument(
        "--max-lines", type=int, default=MAX_LINES, help="lines of a module docstring (default: %(default)s)"
    )
    p.add_argument("--max-words", type=int, default=MAX_WORDS, help="words of a sentence (default: %(default)s)")
    p.add_argument("--stats", action="store_true", help="also print the counts and the share of lines in docstrings")
    args = p.parse_args(argv)
    paths = args.paths or [Path("captioning") if Path("captioning").is_dir() else ROOT / "captioning"]
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        print(f"check_prose: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    report = check(paths, args.max_lines, args.max_words)
    for problem in report.problems:
        print(problem)
    if args.stats:
        share = report.docstring_lines / max(report.lines, 1)
        print(
            f"{report.files} files, {report.lines} lines, {report.docstring_lines} in docstrings ({share:.1%}); "
            f"{report.long_modules} module docstrings over {args.max_lines} lines, "
            f"{report.long_sentences} sentences over {args.max_words} words"
        )
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
