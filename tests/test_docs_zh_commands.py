"""The commands of the Chinese tutorial (docs/zh/) run as written: each ``captioning`` line of its code
blocks is accepted by the command's own parser (``fit``'s by LightningCLI, with ``--print_config``), with
the files it names from the repository (configs) present. Placeholders (``$CKPT``, ``IMAGE``) stand for
the user's files; nothing here trains or reads data."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCS = sorted((ROOT / "docs" / "zh").glob("*.md"))
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def commands(path: Path) -> list[str]:
    """The ``captioning ...`` lines of ``path``'s code blocks, continuation lines joined, comments dropped."""
    found = []
    for block in FENCE.findall(path.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["captioning"]:
                found.append(shlex.join(words))
    return found


ALL = [(path.name, command) for path in DOCS for command in commands(path)]


def test_the_tutorial_has_commands():
    names = {shlex.split(command)[1] for _, command in ALL}
    assert {"fit", "make-shapes", "evaluate", "caption", "attend", "serve", "demo"} <= names, names


@pytest.mark.parametrize("doc,command", [c for c in ALL if shlex.split(c[1])[1] != "fit"])
def test_a_command_parses(doc, command):
    from captioning.cli.main import build_parser

    argv = [w.replace("$", "") for w in shlex.split(command)[1:]]  # $CKPT -> CKPT: the user's file
    if "|" in command:  # a pipe into another tool: the command is its first part
        argv = argv[: argv.index("|")]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            args, unknown = build_parser().parse_known_args(argv)
        except SystemExit as exit:  # --help prints and exits 0; a bad flag exits 2
            assert exit.code == 0 and "--help" in argv, f"{doc}: {command}"
            return
    assert unknown == [], f"{doc}: {command}: {unknown}"


@pytest.mark.parametrize("doc,command", [c for c in ALL if shlex.split(c[1])[1] == "fit"])
def test_a_fit_command_is_accepted_by_lightning_cli(doc, command):
    from captioning.training.cli import run_lightning_cli

    argv = shlex.split(command)[1:]
    config = ROOT / argv[argv.index("--config") + 1]
    assert config.is_file(), f"{doc}: {config} not found"
    argv[argv.index("--config") + 1] = str(config)
    if "--print_config" not in argv:
        argv.append("--print_config")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exit:
        run_lightning_cli(argv)
    assert exit.value.code in (0, None), f"{doc}: {command}"
    assert "model:" in printed.getvalue() and "trainer:" in printed.getvalue()
