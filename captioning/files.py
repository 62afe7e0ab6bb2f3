"""Files written atomically, checkpoints read safely.

A write goes to a temporary file in the destination's folder, is flushed to disk, then renamed
over the destination (``os.replace``): a reader sees the old file or the new one, never half of
one, and a failed write leaves the previous file intact.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from captioning.common import PathLike
from captioning.errors import CheckpointError


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
