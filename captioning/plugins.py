"""Plugins: a user's own modules, imported so that what they register (an attention score, a decoder
kind, a dataset format, a metric, a command, ...) is there without editing the package.

    CAPTIONING_PLUGINS=my_scores.py,my_lab.formats captioning fit ... --model.decoder.score cosine

Two sources: ``CAPTIONING_PLUGINS`` (comma-separated file paths, ``*.py``, or module names) and the
entry points of the group ``captioning.plugins`` of installed distributions (``[project.entry-points
."captioning.plugins"] my_lab = "my_lab.plugin"``; an entry point naming a function calls it). The
command line (before its parser is built), LightningCLI, ``load_model`` (the API and the web server)
call :func:`load_plugins`; a registry asked for a name it does not hold calls it too, so that any
process (DDP's, a loader worker started by spawn) finds a plugin's names. Each plugin is imported
once per process. A plugin file's folder is appended to ``sys.path``, so that processes started by
spawn import it by name. A plugin that fails to import is one line naming it and the exception.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

from captioning.errors import ConfigError

#: the environment variable naming plugin files and modules
ENV = "CAPTIONING_PLUGINS"
#: the entry-point group of installed plugins
GROUP = "captioning.plugins"

_loaded: dict[str, ModuleType | object] = {}  # spec (a file's resolved path, a module or entry point) -> what it gave
_entry_points_read = False
_loading = False  # a plugin's import asking a registry for a name must not load the plugins again


def plugin_specs(value: str | None = None) -> list[str]:
    """The plugins ``value`` (default: the environment's ``CAPTIONING_PLUGINS``) names, in order."""
    value = os.environ.get(ENV, "") if value is None else value
    return [s.strip() for s in value.split(",") if s.strip()]


def is_path(spec: str) -> bool:
    """Whether a plugin spec names a file (``*.py`` or anything with a path separator) rather than a module."""
    return spec.endswith(".py") or os.sep in spec or (os.altsep is not None and os.altsep in spec)


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:300]


def import_plugin_file(spec: str) -> ModuleType:
    """The module of a plugin file, imported under its file name (``my_scores.py`` -> ``my_scores``)."""
    path = Path(spec).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"{ENV}: {spec}: no such plugin file")
    name = path.stem
    if not name.isidentifier():
        raise ConfigError(f"{ENV}: {spec}: a plugin file's name must be a Python module name, got {name!r}")
    existing = sys.modules.get(name)
    if existing is not None:
        if Path(getattr(existing, "__file__", "") or "").resolve() == path:
            return existing
        raise ConfigError(
            f"{ENV}: {spec}: a module named {name!r} is already imported (from {getattr(existing, '__file__', None)}); "
            "rename the plugin file"
        )
    folder = str(path.parent)
    if folder not in sys.path:  # processes started by spawn import it by name (they get sys.path)
        sys.path.append(folder)
    spec_ = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec_)
    sys.modules[name] = module  # before running it: dataclasses and pickling look it up by name
    try:
        spec_.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_plugin(spec: str) -> ModuleType:
    """Import one plugin of ``CAPTIONING_PLUGINS`` (a file path or a module name), once per process;
    a ConfigError in one line naming it and the exception if it fails."""
    key = str(Path(spec).expanduser().resolve()) if is_path(spec) else spec
    if key in _loaded:
        return _loaded[key]
    try:
        module = import_plugin_file(spec) if is_path(spec) else importlib.import_module(spec)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 -- anything a user's module raises, a SyntaxError too
        raise ConfigError(f"{ENV}: plugin {spec} failed to import: {_one_line(err)}") from None
    _loaded[key] = module
    return module


def load_entry_point(entry: metadata.EntryPoint) -> object:
    """Import (and, if it names a function, call) one entry point of :data:`GROUP`."""
    key = f"entry point {entry.name} = {entry.value}"
    if key in _loaded:
        return _loaded[key]
    dist = getattr(getattr(entry, "dist", None), "name", None)
    where = f"entry point {entry.name!r} ({GROUP}{', of ' + dist if dist else ''})"
    try:
        got = entry.load()
        if callable(got) and not isinstance(got, type):
            got()
    except Exception as err:  # noqa: BLE001
        raise ConfigError(f"plugin {entry.value} failed to import: {where}: {_one_line(err)}") from None
    _loaded[key] = got
    return got


def load_plugins(specs: str | None = None) -> list[str]:
    """Import every plugin not imported yet: those ``CAPTIONING_PLUGINS`` names (or ``specs``, the
    same comma-separated form) and the entry points of :data:`GROUP` (read once per process).
    Returns the ones imported by this call. Cheap when there are none, or all are loaded."""
    global _entry_points_read, _loading
    if _loading:
        return []
    before = set(_loaded)
    _loading = True
    try:
        for spec in plugin_specs(specs):
            load_plugin(spec)
        if not _entry_points_read:
            for entry in metadata.entry_points(group=GROUP):
                load_entry_point(entry)
            _entry_points_read = True
    finally:
        _loading = False
    return [k for k in _loaded if k not in before]


def loaded_plugins() -> list[str]:
    """The plugins imported so far in this process (file paths, module names, entry points)."""
    return list(_loaded)
