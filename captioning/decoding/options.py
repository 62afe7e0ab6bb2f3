"""A decoding option as users set it: :func:`option` declares a field of GenerationConfig (its
default and metadata: help, bounds, choices, whether it is a flag and a form field) and
:class:`GenerationOption` is that field described, with the one-line checks and the parsing of a
command line's or a form's text. GenerationConfig's own fields (generation.py) and the logits
processors' options (processors/) are both declared with :func:`option`.

Free of torch, as generation.py is: the ONNX captioner takes the same options with the same checks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from captioning.errors import ConfigError

#: the types an option may have
OPTION_TYPES = (int, float, bool, str, tuple)


def option(
    default: Any,
    help: str,
    *,
    type: type | None = None,
    min: float | None = None,
    max: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
    choices: tuple[str, ...] | None = None,
    cli: bool = True,
    web: bool = True,
    metavar: str | None = None,
    validate: Callable[[Any], str | None] | None = None,
) -> Any:
    """A GenerationConfig field with its option metadata (see :class:`GenerationOption`). ``type``:
    int, float, bool, str or tuple; by default the default's own type (a float option whose default
    is written ``0`` says ``type=float``). A field of GenerationConfig's class body takes its type
    from its annotation."""
    kind = builtin_type(default) if type is None else type
    if kind not in OPTION_TYPES:
        raise TypeError(f"an option is an int, float, bool, str or tuple, not {kind}")
    return dataclasses.field(
        default=default,
        metadata={
            "type": kind,
            "help": help,
            "min": min,
            "max": max,
            "min_inclusive": min_inclusive,
            "max_inclusive": max_inclusive,
            "choices": choices,
            "cli": cli,
            "web": web,
            "metavar": metavar,
            "validate": validate,
        },
    )


def builtin_type(value: Any) -> type:
    """int, float, bool, str or tuple: ``value``'s (a list counts as a tuple)."""
    return tuple if isinstance(value, list) else type(value)


def _shown(value: Any) -> str:
    """``repr(value)``, cut to 60 characters (a message stays one short line)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


@dataclass(frozen=True)
class GenerationOption:
    """One :class:`GenerationConfig` field as an option users set: on the command line, in the web
    form, as a keyword of ``Captioner.__call__``, in a config's ``generation`` section.

    Attributes:
        name: the field (``num_beams``); :attr:`flag` is its command-line flag (``--num-beams``).
        type: ``int``, ``float`` (always finite), ``bool``, ``str`` (one of ``choices``) or ``tuple``
            (token ids >= 0 or words: ``suppress_tokens``; a text given for it is its words).
        default: the field's default (the commands' flags default to None: the model's own).
        help: one line, what the option does.
        min, max: the bounds of a number (None: unbounded on that side); ``min_inclusive`` /
            ``max_inclusive``: whether the bound itself is allowed.
        choices: the allowed values of a ``str`` option.
        cli: a flag of the decoding commands (caption, attend, evaluate, compare-attention).
        web: accepted by the web form and HTTP API. The server may cap what costs it time
            (num_beams, max_new_tokens, location_samples multiply the work) below ``max``.
        metavar: the flag's placeholder in ``--help`` (None: argparse's).
        validate: a further check of a value of the right type: why it is refused, or None.

    :meth:`check` (a value) and :meth:`parse` (a text from a command line or a form) refuse a
    value in one line naming the field, the same line wherever the value came from.
    """

    name: str
    type: type
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    min_inclusive: bool = True
    max_inclusive: bool = True
    choices: tuple[str, ...] | None = None
    cli: bool = True
    web: bool = True
    metavar: str | None = None
    validate: Callable[[Any], str | None] | None = None

    @property
    def flag(self) -> str:
        """The command-line flag: ``--num-beams`` for ``num_beams``."""
        return "--" + self.name.replace("_", "-")

    def expected(self) -> str:
        """What a valid value is, in words: "an integer >= 1", "a finite number in (0, 1]"."""
        if self.type is bool:
            return "true or false"
        if self.type is str:
            return "one of " + ", ".join(self.choices or ())
        if self.type is tuple:
            return "token ids >= 0 or words"
        what = "an integer" if self.type is int else "a finite number"
        low, high = self.min, self.max
        if low is not None and high is not None:
            return (
                f"{what} in {'[' if self.min_inclusive else '('}{_number(low)}, "
                f"{_number(high)}{']' if self.max_inclusive else ')'}"
            )
        if low is not None:
            return f"{what} {'>=' if self.min_inclusive else '>'} {_number(low)}"
        if high is not None:
            return f"{what} {'<=' if self.max_inclusive else '<'} {_number(high)}"
        return what

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is refused ("expected an integer >= 1, got 0"), or None when it is valid."""
        if self.type is tuple:
            problem = token_problem(value)
            return problem or (self.validate(as_tokens(value)) if self.validate else None)
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type is str:
            ok = isinstance(value, str) and value in (self.choices or ())
        else:
            number = isinstance(value, int) if self.type is int else isinstance(value, (int, float))
            ok = number and not isinstance(value, bool) and (self.type is int or math.isfinite(value))
            if ok and self.min is not None:
                ok = value >= self.min if self.min_inclusive else value > self.min
            if ok and self.max is not None:
                ok = value <= self.max if self.max_inclusive else value < self.max
        if not ok:
            return f"expected {self.expected()}, got {_shown(value)}"
        return self.validate(value) if self.validate else None

    def check(self, value: Any) -> Any:
        """``value`` (tokens as a tuple) if valid, else a one-line ConfigError naming the field."""
        if self.type is tuple and isinstance(value, str):  # a text: its words ("" none)
            value = tuple(value.split())
        problem = self.problem(value)
        if problem:
            raise ConfigError(f"{self.name}: {problem}")
        return as_tokens(value) if self.type is tuple else value

    def convert(self, text: str) -> Any:
        """``text`` (a command line's or a form's) as this option's type, unchecked; a ValueError
        says what was expected. Booleans: true/false, yes/no, on/off, 1/0; tokens: comma-separated
        ids or words ("<unk>,3")."""
        text = text.strip()
        if self.type is int:
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"expected an integer, got {_shown(text)}") from None
        if self.type is float:
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"expected a number, got {_shown(text)}") from None
        if self.type is bool:
            truth = {"true": True, "yes": True, "on": True, "1": True}
            truth.update({"false": False, "no": False, "off": False, "0": False})
            if text.lower() not in truth:
                raise ValueError(f"expected true or false, got {_shown(text)}")
            return truth[text.lower()]
        if self.type is tuple:
            items = [t.strip() for t in text.split(",")]
            if not all(items):
                raise ValueError(f"expected comma-separated token ids or words, got {_shown(text)}")
            items = [word for item in items for word in item.split()]  # "a large" is two words
            return tuple(int(t) if t.lstrip("-").isdigit() else t for t in items)
        return text

    def parse(self, text: str) -> Any:
        """``text`` converted and checked: the value, or a one-line ConfigError naming the field."""
        try:
            value = self.convert(text)
        except ValueError as err:
            raise ConfigError(f"{self.name}: {err}") from None
        return self.check(value)


def as_tokens(value: Any) -> tuple:
    """A token option's value as a tuple: one id or word alone becomes a tuple of one."""
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def token_problem(tokens: Any) -> str | None:
    """Why a token option's value is refused (not ids >= 0 or words), or None."""
    if not isinstance(tokens, (str, int, list, tuple)):
        return f"expected a list of token ids or words, got {_shown(tokens)}"
    for t in as_tokens(tokens):
        if isinstance(t, bool) or not isinstance(t, (int, str)) or (isinstance(t, int) and t < 0) or t == "":
            return f"expected token ids >= 0 or words, got {_shown(t)}"
    return None
