"""Checkpoints that survive a crash or a power cut, and that run no code when read: Lightning writes
every checkpoint of the run (the best ones, last.ckpt, a stopped run's) and reads the one it
resumes from (``--ckpt_path``) through :class:`DurableCheckpointIO`.

The file is written to a temporary file in its folder (files.py's atomic write), fsynced and
renamed over the destination, then the folder is fsynced so that the rename itself is on disk: a
reader, or the next run after a crash, sees the previous complete file or the new complete file.
The content is torch.save's, as before: ``torch.load(weights_only=True)`` reads it.

Reading goes through the project's loader (files.py: ``safe_torch_load``: weights-only, legacy
pickles refused, one line naming the file), never Lightning's, which unpickles a URL's file with
``weights_only=False``; a URL is refused (download the file, check it, give its path).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from captioning.errors import CheckpointError
from captioning.files import _atomic_write, safe_torch_load


def refuse_url(path) -> None:
    """A one-line :class:`CheckpointError` for a checkpoint given as a URL (``http://``, ``s3://``...):
    runs resume from local files only, read by ``safe_torch_load``."""
    if "://" in str(path):
        raise CheckpointError(
            f"{path}: refused: a checkpoint to resume from is a local file (download it, and give its path)"
        )


def fsync_folder(folder: str) -> None:
    """Flush a folder's entries (a rename into it) to disk (where the system lets folders be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # e.g. Windows: folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot sync folders
        pass
    finally:
        os.close(fd)


def save_durably(checkpoint: dict, path: str) -> None:
    """``torch.save(checkpoint)`` to ``path``: temporary file, fsync, rename, fsync of the folder."""
    _atomic_write(path, lambda f: torch.save(checkpoint, f))
    fsync_folder(str(Path(path).parent))


class DurableCheckpointIO(TorchCheckpointIO):
    """Lightning's torch.save checkpoints, written durably (:func:`save_durably`; a remote URL is left
    to Lightning's own writer) and read with ``safe_torch_load`` (local files only)."""

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        refuse_url(path)
        return safe_torch_load(os.fspath(path), map_location="cpu" if map_location is None else map_location)

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        save_durably(checkpoint, os.fspath(path))
