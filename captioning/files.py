"""Files written atomically, checkpoints and JSON files read safely, names printed safely.

A write goes to a temporary file in the destination's folder, is flushed to disk, then renamed
over the destination (``os.replace``): a reader sees the old file or the new one, never half of
one, and a failed write leaves the previous file intact. A folder is written the same way
(:func:`atomic_folder`): whole in a temporary sibling, then renamed into place.

Every JSON file a user gives is read by :func:`read_json_file` (:func:`parse_json` for JSON text):
whatever its bytes (not UTF-8, malformed, nested a hundred thousand levels, an integer of more
digits than Python converts), the reader gets one line naming the file, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import shutil
import stat
import textwrap
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from captioning.common import PathLike
from captioning.errors import CaptioningError, CheckpointError


def _temporary_file(folder: Path, name: str) -> tuple[int, str]:
    """A new file ``.NAME.XXXXXXXX.tmp`` in ``folder``, opened for writing with the mode a plain
    ``open`` would give (0o666 less the process's umask, applied by the kernel: the umask is never
    read or changed, so other threads are not disturbed)."""
    for _ in range(100):
        tmp = folder / f".{name}.{os.urandom(6).hex()}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder}: no free temporary file name for {name}")


def _atomic_write(path: PathLike, write: Callable[[Any], None]) -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, fsync it, then move it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temporary_file(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (parent folders are created)."""
    _atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically, as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: PathLike, obj: Any, indent: int = 2) -> None:
    """Write ``obj`` as JSON (UTF-8, non-ASCII kept as is) to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def _unpickler_detail(err: Exception) -> str:
    """The one useful line of torch's long "Weights only load failed" message."""
    text = str(err)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    detail = lines[0] if lines else type(err).__name__
    return detail.split(" was not an allowed global")[0][:200]


def require_file(path: str, error: type, what: str) -> None:
    """Raise ``error`` (one line naming ``path``) unless ``path`` exists and is not a directory.

    ``what`` names the expected kind of file, e.g. "an image file".
    """
    if not os.path.exists(path):
        raise error(f"{path}: no such file")
    if os.path.isdir(path):
        raise error(f"{path}: is a directory, not {what}")


def checkpoints_beside(path: PathLike, limit: int = 6) -> str:
    """For the error of a missing checkpoint: "; beside it: best-epoch=34-step=175.ckpt, last.ckpt" (the
    checkpoints in its folder), "; no folder X" when the folder is missing too, or "" when it has none."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(folder):
        return f"; no folder {os.path.dirname(os.fspath(path)) or folder}"
    names = sorted(n for n in os.listdir(folder) if n.endswith(".ckpt"))
    if not names:
        return ""
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return f"; beside it: {', '.join(names[:limit])}{more}"


def safe_torch_load(path: PathLike, map_location: Any = "cpu", legacy_pickle: bool = False) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, never code.

    Raises :class:`CheckpointError` (one line naming the file) when the file is missing, is not
    a checkpoint, is damaged, or holds objects that would run code when unpickled. Checkpoints are
    read in torch.save's zip format only (``fit`` writes nothing else): a bare (legacy) pickle is
    refused before anything is unpickled, unless ``legacy_pickle`` (third-party weight files, e.g.
    a pip package's ImageNet weights, read weights-only all the same).
    """
    import torch

    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such file{checkpoints_beside(path)}")
    require_file(path, CheckpointError, "a checkpoint file")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes), not a checkpoint")
    with open(path, "rb") as f:
        head = f.read(4)
    if (
        head[:1] == b"\x80" and not legacy_pickle
    ):  # a bare pickle (torch.save's legacy format): never unpickled, whatever it holds
        raise CheckpointError(
            f"{path}: refused to load: not a plain-weights checkpoint (a legacy pickle, not the "
            "zip format `captioning fit` writes; re-save it with torch.save where you trust it)"
        )
    if not (
        head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"
    ):  # torch.save's zip format (or, allowed, a legacy pickle)
        raise CheckpointError(f"{path}: not a checkpoint file (expected one written by `captioning fit`)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err):
            raise CheckpointError(
                f"{path}: refused to load: not a plain-weights checkpoint ({_unpickler_detail(err)})"
            ) from None
        raise CheckpointError(f"{path}: not a readable checkpoint ({_unpickler_detail(err)})") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror or err})") from None
    except Exception as err:  # damaged zip, truncated pickle, random bytes...
        text = " ".join(str(err).split()).split(". ")[0]  # the first sentence (torch adds advice for its developers)
        detail = textwrap.shorten(f"{type(err).__name__}: {text}", 150, placeholder=" ...")
        raise CheckpointError(f"{path}: not a readable checkpoint, damaged or of another format ({detail})") from None


def read_state_dict(path: str, what: str = "weights") -> dict:
    """A state dict (tensor names -> tensors) from a safetensors file or a weights-only torch file, never a
    pickle that runs code; a one-line CheckpointError naming the file (``what`` says what it should hold)
    when it is missing, damaged or not a state dict."""
    import torch

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such {what} file")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        try:
            return load_file(path)
        except Exception as err:  # noqa: BLE001 -- safetensors' own error types: a damaged or truncated file
            detail = " ".join(f"{type(err).__name__}: {err}".split())[:160]
            raise CheckpointError(f"{path}: not a readable safetensors file ({detail})") from None
    state = safe_torch_load(path, legacy_pickle=True)  # weights only, also in torch.save's older format
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: not a state dict (a mapping of tensor names to tensors)")
    return state


def plain_json(value: Any, strict: bool = False) -> Any:
    """JSON types, recursively: mapping keys to strings, tuples to lists, tensors and numpy values to numbers
    (one element) or nested lists. With ``strict`` (values sent to a client), a non-finite float becomes None
    and any other object its ``str``; without it they are kept as they are."""
    if isinstance(value, dict):
        return {str(k): plain_json(v, strict) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v, strict) for v in value]
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if isinstance(value, float):
        return value if not strict or math.isfinite(value) else None
    if hasattr(value, "item") and hasattr(value, "tolist"):  # torch tensors, numpy arrays and scalars
        count = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", 1)
        return plain_json(value.item() if count == 1 else value.tolist(), strict)
    return str(value) if strict else value


# ------------------------------------------------------------------------------------------ folders
def refuse_link(path: PathLike, error: type[CaptioningError], what: str) -> None:
    """One line of ``error`` if ``path`` is a symbolic link: an output is never written through one
    (a link planted where a file or folder will be written would send the write to its target)."""
    if os.path.islink(path):
        raise error(f"{path}: a symbolic link; {what} is never written through a link (give a real path)")


@contextlib.contextmanager
def folder_writer(path: PathLike, error: type[CaptioningError], what: str = "the output folder") -> Iterator[Path]:
    """The folder to write ``path``'s files into, so that no reader sees half of them.

    A ``path`` that does not exist yet (or is an empty folder) is written whole in a temporary
    sibling ``.NAME.XXXXXXXXXXXX.partial`` and renamed to ``path`` when the block ends; if the block
    fails (or the process is killed) ``path`` is left as it was. An existing folder is written into
    as it is (its other files kept): the caller writes each file atomically, the file readers need
    last. ``path`` or a file in it that is a symbolic link is never followed (one line of ``error``)."""
    path = Path(path)
    refuse_link(path, error, what)
    if path.exists() and not path.is_dir():
        raise error(f"{path}: a file, not a folder; give a folder for {what}")
    if path.is_dir() and any(os.scandir(path)):
        yield path
        return
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise error(f"{path}: cannot create its folder {parent} ({err.strerror or err})") from None
    for _ in range(100):
        tmp = parent / f".{path.name}.{os.urandom(6).hex()}.partial"
        try:
            tmp.mkdir()
            break
        except FileExistsError:
            continue
        except OSError as err:
            raise error(f"{path}: cannot write in {parent} ({err.strerror or err})") from None
    else:
        raise error(f"{parent}: no free temporary folder name for {path.name}")
    try:
        yield tmp
        os.rename(tmp, path)  # atomic; over an empty folder too (POSIX)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_file(path: PathLike) -> None:
    """Remove ``path`` if it is there (a link itself, never its target)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# ------------------------------------------------------------------------------------------ JSON
def parse_json(text: str | bytes, where: str, error: type[CaptioningError], what: str = "a JSON file") -> Any:
    """The value of JSON ``text``, or one line of ``error`` naming ``where`` (a file, a field):
    malformed text, nesting deeper than the parser recurses, an integer of more digits than Python
    converts (``sys.get_int_max_str_digits``), bytes that are not UTF-8 (``what`` the text should be)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{where}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except UnicodeDecodeError:
        raise error(f"{where}: not UTF-8 text (is it really {what}?)") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply (arrays or objects inside one another, thousands deep)") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise error(f"{where}: unreadable JSON ({' '.join(str(err).split())[:120]})") from None
    except MemoryError:
        raise error(f"{where}: JSON too large to read into memory") from None


def read_json_file(
    path: PathLike, error: type[CaptioningError], what: str = "a JSON file", missing: str = "no such file"
) -> Any:
    """The value of the JSON file ``path`` (UTF-8, a BOM allowed), read totally: a missing file, a
    folder or another file that is not a regular one (a FIFO, a device), unreadable bytes and
    everything :func:`parse_json` refuses are one line of ``error`` naming the file; ``what`` says
    what the file should be, ``missing`` what a missing one is. The caller checks the value's types."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not {what}") from None
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror or err})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise error(f"{path}: is a directory, not {what}")
        raise error(f"{path}: not a regular file (a pipe or a device), not {what}")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read()
        except OSError as err:
            raise error(f"{path}: cannot read ({err.strerror or err})") from None
        except MemoryError:
            raise error(f"{path}: too large to read into memory") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return parse_json(data, path, error, what)


def json_int(value: Any, where: str, error: type[CaptioningError], low: int, high: int) -> int:
    """``value`` if it is an integer of JSON (not a boolean) in [low, high], else one line of ``error``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{where}: expected an integer, got {type(value).__name__} {_cut(repr(value), 40)}")
    if not low <= value <= high:
        raise error(f"{where}: {_cut(repr(value), 40)} is outside {low}..{high}")
    return value


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------ names
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: the bidirectional controls that reorder what a terminal shows (a name could hide its end)
_BIDI = frozenset((0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)))


def printable(name: str, limit: int | None = None) -> str:
    """A file name (or any text from outside) as one line of a terminal or a TSV record. Control
    characters (newlines, tabs, escape sequences) show as ``\\n``, ``\\t``, ``\\x1b``, and the bytes
    of a name that is not UTF-8 (os.fsdecode's surrogates) as ``\\xNN``. With ``limit``, a longer
    name is cut in its middle with "..." (a 40 MB list line stays a short message)."""
    if limit is not None and len(name) > limit:
        half = max(1, (limit - 3) // 2)
        name = name[:half] + "..." + name[-half:]
    if name.isprintable() and name.isascii():
        return name
    out = []
    for ch in name:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as surrogateescape keeps it
            out.append(f"\\x{code - 0xDC00:02x}")
        elif unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") or code in _BIDI:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)
