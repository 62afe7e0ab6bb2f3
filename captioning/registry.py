"""Registries: one per extension point, so that a new kind of thing is one file and its test.

Each extension point (attention scores, encoders, decoder kinds, objectives, data formats,
tokenizers, ...) keeps one :class:`Registry`. An implementation registers itself where it is
defined::

    SCORES = Registry("attention score", field="model.decoder.score")

    @SCORES.register("additive")
    class AdditiveAttention(Score): ...

and everything else asks the registry: ``SCORES.get(name)`` builds or looks up, ``SCORES.check(name)``
validates a config field (one line naming the field and every registered name), ``SCORES.names()``
lists them for help texts and ``list_*()`` functions. Nothing else keeps a list of the names.

A registry only knows the implementations whose modules were imported: the module that owns a
registry imports its built-in implementations (so ``from captioning.models.attention import
SCORES`` sees all of them); a user's own implementation registers when the user imports it. A
plugin's (captioning/plugins.py: ``CAPTIONING_PLUGINS``, the ``captioning.plugins`` entry points)
registers when the plugins are imported, which a registry does when asked for a name it lacks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from captioning.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> implementations of one extension point.

    Args:
        kind: what an entry is, in words ("attention score"), for messages.
        field: the config field or flag that names an entry ("model.decoder.score"), for messages.
    """

    def __init__(self, kind: str, field: str | None = None):
        self.kind = kind
        self.field = field
        self._entries: dict[str, T] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """A decorator that registers its class or function under ``name`` (and ``aliases``)."""

        def add(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._entries and self._entries[key] is not obj:
                    raise ValueError(f"{self.kind} {key!r} is registered twice")
                self._entries[key] = obj
            return obj

        return add

    def add(self, name: str, obj: T) -> T:
        """Register ``obj`` under ``name`` (for entries that are not classes or functions)."""
        return self.register(name)(obj)

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered, after importing the plugins not imported yet when it is not
        (a plugin may register it, in a process that has not imported them: DDP's, a spawned worker)."""
        if isinstance(name, str) and name not in self._entries:
            from captioning.plugins import load_plugins

            load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def unknown(self, name: object, field: str | None = None, extra: str = "") -> ConfigError:
        """The one-line error for a name that is not registered (``extra``: other accepted forms)."""
        where = field or self.field
        prefix = f"{where}: " if where else ""
        choices = ", ".join(self._entries)
        more = f", or {extra}" if extra else ""
        return ConfigError(
            f"{prefix}unknown {self.kind} {name!r}; expected one of {choices}{more} "
            "(a plugin's: name its module in CAPTIONING_PLUGINS)"
        )

    def check(self, name: object, field: str | None = None) -> str:
        """``name`` if it is registered (``in``: plugins included), else :meth:`unknown`'s error."""
        if not isinstance(name, str) or name not in self:
            raise self.unknown(name, field)
        return name

    def get(self, name: object, field: str | None = None) -> T:
        """The implementation registered under ``name``, else :meth:`unknown`'s error."""
        return self._entries[self.check(name, field)]
