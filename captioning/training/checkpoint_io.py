"""Checkpoints that survive a crash or a power cut: Lightning writes every checkpoint of the run
(the best ones, last.ckpt, a stopped run's) through :class:`DurableCheckpointIO`.

The file is written to a temporary file in its folder (files.py's atomic write), fsynced and
renamed over the destination, then the folder is fsynced so that the rename itself is on disk: a
reader, or the next run after a crash, sees the previous complete file or the new complete file.
The content is torch.save's, as before: ``torch.load(weights_only=True)`` reads it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from captioning.files import _atomic_write


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
    """Lightning's torch.save checkpoints, written durably (:func:`save_durably`); local paths only
    (a remote URL is left to Lightning's own writer)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        save_durably(checkpoint, os.fspath(path))
