"""A feature cache: the frozen encoder's grids (L, D), extracted once and read instead of images.

Layout of a cache folder, one *part* per extraction process (``--shard i/n``; ``part-000-of-001``
without sharding)::

    part-000-of-002.index.json   {"image_ids": [...], "grid": [L, D], "dtype": "float16", "meta": {...}}
    part-000-of-002.f16          numpy memmap (rows, L, D) float16, row r = image_ids[r]
    part-000-of-002.done         numpy memmap (rows,) uint8, 1 once row r is flushed to disk

The index is written first (atomically); a row's done flag is set and flushed only after the row's
data was flushed, so an interrupted extraction resumes at the rows whose flag is 0 and a half-written
row is never read as valid. This file reads caches; captioning/cli/extract.py writes them. Readers merge every part of the folder. Memory does not grow with the
dataset: grids stay on disk (memmaps opened lazily, once per process / DataLoader worker) and the
index is three flat arrays (24 bytes an image).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence

import numpy as np
import torch

from captioning.common import PathLike
from captioning.errors import ConfigError, ImageError

#: the settings of an extraction a cache records in its index's ``meta``, and a run reading it (or
#: an extraction resuming it) must share: another value means other features for the same image
SETTINGS = ("image_size", "encoder", "grid_size", "pretrained", "interpolation")


def check_meta(recorded: dict, ours: dict, where: str) -> None:
    """One line of ConfigError naming the first of :data:`SETTINGS` whose value in ``recorded`` (a
    cache's meta) differs from ``ours`` (a run's); a setting either side lacks is not compared (as
    in caches written before it was recorded)."""
    for setting in SETTINGS:
        theirs, mine = recorded.get(setting), ours.get(setting)
        if mine is not None and theirs is not None and theirs != mine:
            raise ConfigError(
                f"{where}: features extracted with {setting} {theirs!r}, this run has {mine!r}; "
                f"extract them again for these settings (captioning extract-features) or match {setting}"
            )


def read_index(path: str) -> dict:
    """A part's index, checked: {"image_ids": [int, ...], "grid": [L, D], "meta": {...}}; one line of
    ConfigError naming the file otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ConfigError(f"{path}: not a readable feature-cache index ({' '.join(str(err).split())[:120]})") from None
    if not isinstance(index, dict):
        raise ConfigError(f"{path}: a feature-cache index must be a JSON object, got {type(index).__name__}")
    ids, grid = index.get("image_ids"), index.get("grid")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f'{path}: "image_ids" must be a list of integers')
    if not (
        isinstance(grid, list)
        and len(grid) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in grid)
    ):
        raise ConfigError(f'{path}: "grid" must be [L, D], two positive integers, got {grid!r}')
    return index


def _check_sizes(base: str, rows: int, grid: tuple) -> None:
    """The data and done files of a part hold exactly the rows its index lists."""
    expected = {".f16": rows * grid[0] * grid[1] * np.dtype(np.float16).itemsize, ".done": rows}
    for suffix, size in expected.items():
        path = base + suffix
        if not os.path.isfile(path):
            raise ConfigError(
                f"{path}: missing (the cache part's index lists {rows} images); rerun `captioning extract-features`"
            )
        actual = os.path.getsize(path)
        if actual != size:
            raise ConfigError(
                f"{path}: {actual:,} bytes, but its index lists {rows} images of grid {list(grid)} "
                f"({size:,} bytes); the cache is damaged or mixes extractions: rerun `captioning extract-features`"
            )


class FeatureCache:
    """Read-only view of a cache folder: ``cache[image_id]`` -> (L, D) float16 tensor."""

    def __init__(self, root: PathLike):
        self.root = os.fspath(root)
        indexes = sorted(glob.glob(os.path.join(self.root, "*.index.json")))
        if not indexes:
            raise ConfigError(
                f"{self.root}: not a feature cache (no *.index.json; write one with `captioning extract-features`)"
            )
        self.parts: list[str] = []
        ids, parts, rows, grid = [], [], [], None
        self.meta: dict = {}  # the parts' meta, merged: they agree on every setting each records
        for k, path in enumerate(indexes):
            index = read_index(path)
            if grid is not None and tuple(index["grid"]) != grid:
                raise ConfigError(f"{path}: grid {index['grid']} differs from the other parts' {list(grid)}")
            grid = tuple(index["grid"])
            meta = index.get("meta") if isinstance(index.get("meta"), dict) else {}
            for setting in SETTINGS:
                if setting in meta and setting in self.meta and meta[setting] != self.meta[setting]:
                    raise ConfigError(
                        f"{path}: extracted with {setting} {meta[setting]!r}, another part of the cache "
                        f"with {self.meta[setting]!r}: parts of different extractions; extract them again"
                    )
            self.meta = {**meta, **self.meta}
            base = path[: -len(".index.json")]
            n = len(index["image_ids"])
            _check_sizes(base, n, grid)
            self.parts.append(base)
            ids.append(np.asarray(index["image_ids"], dtype=np.int64))
            parts.append(np.full(n, k, dtype=np.int32))
            rows.append(np.arange(n, dtype=np.int64))
        ids, parts, rows = np.concatenate(ids), np.concatenate(parts), np.concatenate(rows)
        order = np.argsort(ids, kind="stable")
        self.ids, self.part_of, self.row_of = ids[order], parts[order], rows[order]  # sorted by image_id
        dup = self.ids[1:][self.ids[1:] == self.ids[:-1]]
        if dup.size:
            raise ConfigError(f"{self.root}: image {int(dup[0])} is in two parts (shards of different extractions?)")
        self.grid_shape = grid  # (L, D)
        self._maps: list | None = None
        self._pid: int | None = None

    def check(
        self,
        image_size: int | None = None,
        encoder: str | None = None,
        grid_size: int | None = None,
        interpolation: str | None = None,
        pretrained: bool | None = None,
    ) -> None:
        """One line of ConfigError, naming the setting, if the cache was extracted with another image
        size, encoder, grid size, resize filter or pretrained weights than the run's (settings the
        cache did not record, as caches written before the filter was recorded, are not checked)."""
        check_meta(
            self.meta,
            {
                "image_size": image_size,
                "encoder": encoder,
                "grid_size": grid_size,
                "interpolation": interpolation,
                "pretrained": pretrained,
            },
            self.root,
        )

    def __getstate__(self) -> dict:  # DataLoader workers reopen the memmaps themselves
        state = dict(self.__dict__)
        state["_maps"], state["_pid"] = None, None
        return state

    def _open(self) -> list:
        if self._maps is None or self._pid != os.getpid():
            self._maps = []
            for base in self.parts:
                rows = len(np.memmap(base + ".done", dtype=np.uint8, mode="r"))
                data = np.memmap(base + ".f16", dtype=np.float16, mode="r", shape=(rows, *self.grid_shape))
                self._maps.append((data, os.open(base + ".done", os.O_RDONLY)))
            self._pid = os.getpid()
        return self._maps

    def _locate(self, image_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, position in the sorted index) of each id."""
        pos = np.searchsorted(self.ids, image_ids).clip(0, max(len(self.ids) - 1, 0))
        return (self.ids[pos] == image_ids) if len(self.ids) else np.zeros(len(image_ids), bool), pos

    def missing(self, image_ids: Sequence[int]) -> list[int]:
        """The ids that have no complete row (not extracted, or the extraction was interrupted)."""
        ids = np.asarray(list(image_ids), dtype=np.int64)
        found, pos = self._locate(ids)
        done = [np.memmap(base + ".done", dtype=np.uint8, mode="r") for base in self.parts]
        ok = np.array([bool(f) and bool(done[self.part_of[p]][self.row_of[p]]) for f, p in zip(found, pos)], dtype=bool)
        return ids[~ok].tolist() if len(ids) else []

    def __contains__(self, image_id: int) -> bool:
        return not self.missing([image_id])

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, image_id: int) -> torch.Tensor:
        found, pos = self._locate(np.asarray([image_id], dtype=np.int64))
        if not found[0]:
            raise ImageError(f"{self.root}: no features for image {image_id}")
        data, done_fd = self._open()[self.part_of[pos[0]]]
        row = int(self.row_of[pos[0]])
        # the done flag is read fresh: a row still being written by a running extraction is refused
        if os.pread(done_fd, 1, row) != b"\x01":
            raise ImageError(
                f"{self.root}: features of image {image_id} are incomplete (interrupted extraction? rerun it)"
            )
        return torch.from_numpy(np.array(data[row]))  # (L, D) float16, copied out of the memmap
