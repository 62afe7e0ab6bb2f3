"""No flag of any command takes a number that is not finite: every option whose value is parsed as a float
refuses nan, inf and -inf with argparse's one-line error (exit 2), before anything runs."""

import argparse

import pytest

from captioning.cli.main import build_parser


def float_options() -> list[tuple[str, str]]:
    """(command, flag) of every option of every command whose type parses floats."""
    found = []
    root = build_parser()
    commands = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in commands.choices.items():
        for action in parser._actions:
            kind = action.type
            if not action.option_strings or kind is None:
                continue
            try:
                parsed = kind("0.5")
            except (argparse.ArgumentTypeError, ValueError, TypeError):
                continue  # not a number (a path, a list), or one below its bound
            if isinstance(parsed, float):
                found.append((name, action.option_strings[-1]))
    return found


OPTIONS = float_options()


def test_the_walk_finds_the_float_options():
    flags = {flag for _, flag in OPTIONS}
    assert {"--length-penalty", "--temperature", "--top-p", "--send-timeout"} <= flags, sorted(flags)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize(("command", "flag"), OPTIONS, ids=[f"{c}{f}" for c, f in OPTIONS])
def test_a_float_option_refuses_non_finite_values(command, flag, value, capsys):
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in commands.choices[command]._actions if flag in a.option_strings)
    with pytest.raises((argparse.ArgumentTypeError, ValueError)) as refused:
        action.type(value)
    assert "\n" not in str(refused.value)
