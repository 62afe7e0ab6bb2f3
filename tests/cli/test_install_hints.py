"""One install hint everywhere: a message that names an optional part of the project says
``pip install -e '.[EXTRA]'`` (the project is installed from its clone; ``captioning`` is no
package on PyPI), with EXTRA one of pyproject.toml's extras."""

import re

from tests.helpers import ROOT

HINT = re.compile(r"pip install -e '\.\[([\w,-]+)\]'")
#: what a message must not say: the project's name as a PyPI package
WRONG = re.compile(r"pip install [\"']?captioning\b")


def extras() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, flags=re.M))


def sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "captioning").rglob("*.py"))}


def test_the_hints_name_existing_extras():
    named = {
        (path, extra) for path, text in sources().items() for group in HINT.findall(text) for extra in group.split(",")
    }
    assert named, "no install hint found: the pattern is out of date"
    assert {extra for _, extra in named} <= extras(), sorted(named)


def test_no_hint_names_a_package_that_is_not_on_pypi():
    wrong = [
        f"{path}:{text[: m.start()].count(chr(10)) + 1}"
        for path, text in sources().items()
        for m in WRONG.finditer(text)
    ]
    assert not wrong, f"say pip install -e '.[EXTRA]' instead, in {', '.join(wrong)}"
