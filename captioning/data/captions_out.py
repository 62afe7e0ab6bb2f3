"""``captioning caption --out FILE``: captions appended as they are made, and runs resumed.

The file is JSON lines (one object per image: ``{"image", "generated_text", "score", ...}``, or
``{"image", "error"}`` for an image that could not be read), or CSV when its name ends in ``.csv``
(columns ``image, generated_text, score, error``). Each batch's lines are written by one ``write``
on a file opened for appending and flushed to the system at once: a run stopped at any moment
leaves whole lines (a line cut by a crash inside that write is removed when the run is resumed).

Run again with the same file, it is read first: every line must be this command's (else the file is
refused, one line naming it and the line, and never written to); the images it names are skipped.
Their names are kept as 8-byte hashes in a sorted array (8 MB per million images; the chance that
two of a million names share a hash is about 3e-8).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from collections.abc import Iterable, Sequence

import numpy as np

from captioning.errors import ConfigError

#: the CSV file's columns
CSV_COLUMNS = ("image", "generated_text", "score", "error")


def name_key(name: str) -> int:
    """An image name's 64-bit hash (blake2b), the resume set's key."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class NameSet:
    """A set of image names held as sorted 64-bit hashes; ``in`` by binary search."""

    def __init__(self, keys: Iterable[int] = ()):
        self.keys = np.unique(np.fromiter(keys, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, name: str) -> bool:
        key = name_key(name)
        i = int(np.searchsorted(self.keys, key))
        return i < len(self.keys) and int(self.keys[i]) == key


class CaptionsFile:
    """The ``--out`` file of ``captioning caption`` (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, option: str = "--out"):
        self.path = os.fspath(path)
        self.option = option
        self.csv = self.path.lower().endswith(".csv")
        self._fd: int | None = None

    def _refuse(self, why: str) -> ConfigError:
        return ConfigError(
            f"{self.option} {self.path}: {why}; it is not a file written by `captioning caption --out` "
            "(refused, left as it is): give a new file name, or that command's own file to resume"
        )

    def check(self) -> NameSet:
        """The names already in the file (empty if there is none), after checking that every line is
        this command's; a cut last line is removed. One-line ConfigError otherwise (nothing written)."""
        if os.path.isdir(self.path):
            raise ConfigError(f"{self.option} {self.path}: is a folder; give a file name (.jsonl, or .csv)")
        if not os.path.exists(self.path):
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                raise ConfigError(f"{self.option} {self.path}: no such folder {parent}")
            if not os.access(parent, os.W_OK):
                raise ConfigError(f"{self.option} {self.path}: cannot write in {parent} (permission denied)")
            return NameSet()
        if not os.access(self.path, os.R_OK | os.W_OK):
            raise ConfigError(f"{self.option} {self.path}: cannot read and append to it (permission denied)")
        keys, complete = self._read_keys()
        size = os.path.getsize(self.path)
        if complete < size:  # a line cut by a crash in the middle of its write
            with open(self.path, "r+b") as f:
                f.truncate(complete)
        return NameSet(keys)

    def _read_keys(self) -> tuple[list[int], int]:
        """The hashes of the names in the file and the byte length of its complete lines."""
        keys: list[int] = []
        complete = 0
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, 1):
                if not raw.endswith(b"\n"):
                    break  # the last line, cut
                complete += len(raw)
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise self._refuse(f"line {number} is not UTF-8 text") from None
                if self.csv:
                    name = self._csv_name(text, number)
                else:
                    name = self._json_name(text, number)
                if name is not None:
                    keys.append(name_key(name))
        return keys, complete

    def _json_name(self, text: str, number: int) -> str:
        try:
            row = json.loads(text)
        except ValueError:
            raise self._refuse(f"line {number} is not JSON") from None
        if not (
            isinstance(row, dict) and isinstance(row.get("image"), str) and ("generated_text" in row or "error" in row)
        ):
            raise self._refuse(f'line {number} is not an object with "image" and "generated_text" or "error"')
        return row["image"]

    def _csv_name(self, text: str, number: int) -> str | None:
        try:
            [row] = list(csv.reader([text]))
        except (csv.Error, ValueError):
            raise self._refuse(f"line {number} is not a CSV row") from None
        if number == 1:
            if tuple(row) != CSV_COLUMNS:
                raise self._refuse(f"its first line is not the header {','.join(CSV_COLUMNS)}")
            return None
        if len(row) != len(CSV_COLUMNS):
            raise self._refuse(f"line {number} has {len(row)} columns, not {len(CSV_COLUMNS)}")
        return row[0]

    def _encode(self, rows: Sequence[dict], header: bool) -> bytes:
        if not self.csv:
            return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if header:
            writer.writerow(CSV_COLUMNS)
        for r in rows:
            writer.writerow([r.get("image"), r.get("generated_text", ""), r.get("score", ""), r.get("error", "")])
        return buffer.getvalue().encode("utf-8")

    def append(self, rows: Sequence[dict]) -> None:
        """Append one batch's lines with one write (the file is created by the first batch)."""
        if not rows:
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        header = self.csv and os.fstat(self._fd).st_size == 0
        data = memoryview(self._encode(rows, header))
        while data:  # a regular file takes it whole; a short write goes on where it stopped
            written = os.write(self._fd, data)
            data = data[written:]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
