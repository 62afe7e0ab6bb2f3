"""A feature cache: the frozen encoder's grids (L, D), extracted once and read instead of images.

A cache folder holds one *part* per extraction process (``--shard i/n``; ``part-000-of-001`` without
sharding): ``part-I-of-N.index.json`` (the image ids, the grid ``[L, D]``, ``dtype`` and ``meta``),
the data file ``part-I-of-N.f16`` (``.f32``: float32), a bare C-order array (rows, L, D) that
``np.memmap`` maps (:meth:`FeatureCache.arrays`), and ``part-I-of-N.done``, one uint8 flag a row.
``dtype`` (:data:`DTYPES`) is the stored type: float16 by default (half the disk and page cache of
float32); the reader gives rows in it and the model casts them to float32 on its device
(ShowAttendTell.features). ``meta`` holds the extraction's settings (:data:`SETTINGS`; ``grid_size`` is
the side of a pooled grid, ``captioning extract-features --pool N``), which a run reading the cache must
share. A row's done flag is set and flushed only after the row's data was, so an interrupted extraction
resumes at the rows whose flag is 0. This file reads caches (readers merge every part of the folder);
captioning/data/features/writer.py writes them.

Memory does not grow with the cache: a row is read when a sample asks for it, with one positional
read (``os.preadv``) into a fresh array, from file descriptors opened lazily once per process. The
index is three flat arrays (24 bytes an image). Rows are read, not mapped: why, and the read rates of
both, in docs/PERFORMANCE.md, "Feature cache". The layout in full: docs/TRAINING.md, "Feature caches".
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

import numpy as np
import torch

from captioning import compat
from captioning.common import PathLike, grid_shape
from captioning.errors import ConfigError, ImageError
from captioning.files import read_json_file

#: the dtypes a cache may store its grids in -> the suffix of its data files
DTYPES = {"float16": ".f16", "float32": ".f32"}

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


#: the most values one cache row (one image's grid, L x D) may hold: far above any encoder's (a
#: 37 x 37 grid of 1,536 features is 2.1 million), so that an index cannot make every read of a row
#: allocate what it likes
MAX_ROW_VALUES = 1 << 24


def read_index(path: str) -> dict:
    """A part's index, checked: {"image_ids": [int, ...], "grid": [L, D], "meta": {...}}; one line of
    ConfigError naming the file otherwise (any bytes: files.py read_json_file; ids 64-bit integers,
    each once; a grid of at most :data:`MAX_ROW_VALUES` values)."""
    index = read_json_file(path, ConfigError, "a feature-cache index")
    if not isinstance(index, dict):
        raise ConfigError(f"{path}: a feature-cache index must be a JSON object, got {type(index).__name__}")
    ids, grid = index.get("image_ids"), index.get("grid")
    dtype = index.get("dtype", compat.UNRECORDED_FEATURE_DTYPE)
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ConfigError(f'{path}: "dtype" must be one of {", ".join(DTYPES)}, got {repr(dtype)[:40]}')
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f'{path}: "image_ids" must be a list of integers')
    outside = next((i for i in ids if not -(2**63) <= i < 2**63), None)
    if outside is not None:
        raise ConfigError(f'{path}: "image_ids": {str(outside)[:40]} is outside the 64-bit integers an image id may be')
    if len(set(ids)) != len(ids):
        raise ConfigError(f'{path}: "image_ids" lists an image twice (a damaged index)')
    if not (
        isinstance(grid, list)
        and len(grid) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in grid)
    ):
        raise ConfigError(f'{path}: "grid" must be [L, D], two positive integers, got {repr(grid)[:60]}')
    if grid[0] * grid[1] > MAX_ROW_VALUES:
        raise ConfigError(
            f'{path}: "grid" {str(grid[0])[:20]} x {str(grid[1])[:20]} is more than the {MAX_ROW_VALUES:,} values a cache row may hold'
        )
    return index


def index_dtype(index: dict) -> str:
    """The stored dtype of a part's (checked) index: its ``dtype``, float16 if it records none."""
    return index.get("dtype", compat.UNRECORDED_FEATURE_DTYPE)


def _check_sizes(base: str, rows: int, grid: tuple, dtype: str) -> None:
    """The data and done files of a part hold exactly the rows its index lists."""
    expected = {DTYPES[dtype]: rows * grid[0] * grid[1] * np.dtype(dtype).itemsize, ".done": rows}
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


def _read_into(fd: int, out: np.ndarray, offset: int) -> int:
    """Read ``out.nbytes`` bytes at ``offset`` of ``fd`` into ``out``; the bytes read."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [memoryview(out).cast("B")], offset)
    data = os.pread(fd, out.nbytes, offset)  # without preadv: one more copy
    out.reshape(-1).view(np.uint8)[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return len(data)


class FeatureCache:
    """Read-only view of a cache folder: ``cache[image_id]`` -> (L, D) tensor of the stored
    :attr:`dtype` (float16 unless the cache was written with ``--dtype float32``)."""

    def __init__(self, root: PathLike):
        self.root = os.fspath(root)
        indexes = sorted(glob.glob(os.path.join(self.root, "*.index.json")))
        if not indexes:
            raise ConfigError(
                f"{self.root}: not a feature cache (no *.index.json; write one with `captioning extract-features`)"
            )
        self.parts: list[str] = []
        ids, parts, rows, grid, dtype = [], [], [], None, None
        self.meta: dict = {}  # the parts' meta, merged: they agree on every setting each records
        for k, path in enumerate(indexes):
            index = read_index(path)
            if grid is not None and tuple(index["grid"]) != grid:
                raise ConfigError(f"{path}: grid {index['grid']} differs from the other parts' {list(grid)}")
            grid = tuple(index["grid"])
            if dtype is not None and index_dtype(index) != dtype:
                raise ConfigError(f"{path}: dtype {index_dtype(index)} differs from the other parts' {dtype}")
            dtype = index_dtype(index)
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
            _check_sizes(base, n, grid, dtype)
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
        self.dtype: str = dtype  # the stored dtype, a key of DTYPES
        self.row_bytes = grid[0] * grid[1] * np.dtype(dtype).itemsize
        self._files: list | None = None  # per part: (data fd, done fd), opened lazily in each process
        self._pid: int | None = None

    @property
    def nbytes(self) -> int:
        """The bytes of every row of the cache (its data files' size)."""
        return len(self.ids) * self.row_bytes

    @property
    def grid_side(self) -> tuple[int, int]:
        """(gh, gw) of the cache's L locations (row-major, as the encoders flatten them)."""
        return grid_shape(self.grid_shape[0])

    def check_grid(self, grid: tuple[int, int], whose: str) -> None:
        """One line of ConfigError unless ``grid`` (L, D), the annotation vectors ``whose`` encoder
        gives (a model's), is the cache's: a model reads only the grid it was built for (the stored
        dtype may differ: rows are cast to float32 on the device)."""
        (L, D), (mine_l, mine_d) = self.grid_shape, (int(grid[0]), int(grid[1]))
        if (L, D) == (mine_l, mine_d):
            return
        gh, gw = self.grid_side
        pooled = f", pooled to {gh}x{gw}" if self.meta.get("pool") else ""
        hint = (
            f"set --model.encoder.grid_size {gh} or extract the features again with the model's encoder"
            if D == mine_d and gh == gw
            else "extract the features again with the model's encoder (captioning extract-features)"
        )
        raise ConfigError(
            f"{self.root}: features of {L} locations x {D} ({gh}x{gw} grid{pooled}), but {whose} gives "
            f"{mine_l} x {mine_d}; {hint}"
        )

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

    def __getstate__(self) -> dict:  # DataLoader workers open the files themselves
        state = dict(self.__dict__)
        state["_files"], state["_pid"] = None, None
        return state

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Close this process's file descriptors (reopened on the next read)."""
        files, self._files = getattr(self, "_files", None), None
        if files and getattr(self, "_pid", None) == os.getpid():
            for data_fd, done_fd, _ in files:
                os.close(data_fd)
                os.close(done_fd)

    def _open(self) -> list:
        if self._files is None or self._pid != os.getpid():
            self._files = None  # a forked copy's descriptors are its parent's: left to it
            files = []
            for base in self.parts:
                done_fd = os.open(base + ".done", os.O_RDONLY)
                seen = np.frombuffer(bytearray(os.pread(done_fd, os.path.getsize(base + ".done"), 0)), np.uint8)
                # (data fd, done fd, the done flags as read: a flag once 1 stays 1)
                files.append((os.open(base + DTYPES[self.dtype], os.O_RDONLY), done_fd, seen))
            self._files, self._pid = files, os.getpid()
        return self._files

    def arrays(self) -> list[np.memmap]:
        """Each part's rows as a read-only memory map (rows, L, D) of the stored dtype, in part order
        (for tools; the loaders read rows with :meth:`__getitem__`, which maps nothing)."""
        out = []
        for base in self.parts:
            rows = os.path.getsize(base + ".done")
            out.append(np.memmap(base + DTYPES[self.dtype], dtype=self.dtype, mode="r", shape=(rows, *self.grid_shape)))
        return out

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
        data_fd, done_fd, seen = self._open()[self.part_of[pos[0]]]
        row = int(self.row_of[pos[0]])
        # a flag not yet seen set is read fresh: a row still being written by a running extraction is refused
        if not seen[row]:
            if os.pread(done_fd, 1, row) != b"\x01":
                raise ImageError(
                    f"{self.root}: features of image {image_id} are incomplete (interrupted extraction? rerun it)"
                )
            seen[row] = 1
        out = np.empty(self.grid_shape, dtype=self.dtype)
        got = _read_into(data_fd, out, row * self.row_bytes)  # one read, nothing mapped
        if got != self.row_bytes:
            raise ImageError(
                f"{self.root}: features of image {image_id}: read {got} of {self.row_bytes} bytes (the cache "
                "was truncated while reading?)"
            )
        return torch.from_numpy(out)  # (L, D) of the stored dtype
