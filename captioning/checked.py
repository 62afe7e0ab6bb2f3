"""Dataclasses from plain dictionaries (a file's JSON, a config's YAML), every field checked: a wrong
type, an unknown setting or a value out of range is one line of :class:`ConfigError` naming the
field (``model.decoder.hidden_dim: expected an integer, got 'x'``). Model descriptions
(models/spec.py) and decoder configs (models/kinds.py) are read with :func:`from_dict`."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Union

from captioning.errors import ConfigError


def _kind(hint) -> str:
    """A type hint in words, for errors."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _kind(a) for a in args)
    if origin is tuple:
        return f"a list of {_kind(args[0])}s"
    if dataclasses.is_dataclass(hint):
        return "a mapping of settings"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _checked(value: Any, hint, where: str) -> Any:
    """``value`` if it has the type ``hint`` (converted: int -> float, list -> tuple, dict -> dataclass),
    else a one-line ConfigError naming ``where``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _checked(value, option, where)
            except ConfigError:
                pass
    elif origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(_checked(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        return value
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise ConfigError(f"{where}: expected {_kind(hint)}, got {shown}")


def from_dict(cls, data: Any, where: str):
    """An instance of the dataclass ``cls`` from a dictionary of its fields, each checked."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(data).__name__} {_short(data)}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(str(k) if str(k).isidentifier() else repr(str(k)) for k in data if k not in names)  # one line
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f"; did you mean {where}.{close[0]}?" if close else ""
        raise ConfigError(
            f"{where}: unknown setting(s) {', '.join(unknown)}{hint} (this version knows {', '.join(names)})"
        )
    hints = typing.get_type_hints(cls)
    values = {name: _checked(data[name], hints[name], f"{where}.{name}") for name in names if name in data}
    try:
        return cls(**values)
    except ConfigError as err:  # the dataclass's own range checks name "model.decoder.x" or "x"
        message = str(err)
        raise ConfigError(
            message if message.startswith(where) or message.startswith("model.") else f"{where}.{message}"
        ) from None


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
