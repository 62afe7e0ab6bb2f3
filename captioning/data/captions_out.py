"""``captioning caption --out FILE``: captions appended as they are made, and runs resumed.

The file is JSON lines (``{"image", "generated_text", "score", ...}`` per image, or ``{"image",
"error"}``), or CSV for a name ending in ``.csv`` (a header ``image,generated_text,score,error``,
then a record per image). A CSV text cell that a spreadsheet would run as a formula (``= + - @``,
a tab, a quote) starts with a quote ``'``. Names keep the bytes the file system gives them
(surrogateescape). Each batch is one ``write`` on a file opened for appending: a run stopped at any
moment leaves whole lines (a line cut inside that write is removed when the run is resumed).

The file must be a regular file, and one run writes it at a time: it is locked from the check
before the model loads to the end (a second run is refused in one line). Run again, the file is
read first and taken only when it is this command's (CSV: its header; JSON lines: every line one
of its objects, a cut last line the start of one), else refused in one line and never written to.
The images it names are skipped, compared as absolute normalised paths (data/inputs.py:
``normal_name``: ``dir``, ``./dir`` and ``$PWD/dir`` name the same images) and kept as 8-byte
hashes in a sorted array (8 MB per million images; two of a million names share one with a chance
of about 3e-8).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import stat
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from captioning.data.inputs import normal_name
from captioning.errors import ConfigError
from captioning.files import parse_json, printable

try:  # POSIX: the lock that keeps a second run off the file; elsewhere the file is not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

#: the CSV file's columns
CSV_COLUMNS = ("image", "generated_text", "score", "error")
CSV_HEADER = (",".join(CSV_COLUMNS) + "\n").encode()
#: how every JSON line of the file starts (json.dumps of a row, "image" first)
JSON_START = b'{"image": '
#: the first characters of a CSV text cell that a spreadsheet takes for a formula (OWASP's list),
#: and the quote that marks one as escaped
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
ESCAPE = "'"


def name_key(name: str) -> int:
    """An image name's 64-bit hash (blake2b of its normalised path, data/inputs.py: ``normal_name``),
    the resume set's key."""
    data = normal_name(name).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


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


def escape_cell(text: str) -> str:
    """A CSV text cell as written: one a spreadsheet would take for a formula gets a leading quote."""
    return ESCAPE + text if text.startswith((*FORMULA_STARTS, ESCAPE)) else text


def unescape_cell(text: str) -> str:
    """A CSV text cell as read back (:func:`escape_cell` undone)."""
    return text[1:] if text.startswith(ESCAPE) else text


def _decode(raw: bytes) -> tuple[str, bool]:
    """(text, strict): a line's text, and whether it was UTF-8 (else its other bytes kept as
    surrogates, as the file's names are written)."""
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", "surrogateescape"), False


class CaptionsFile:
    """The ``--out`` file of ``captioning caption`` (see the module docstring): :meth:`check` opens
    and locks it and lists the names in it, :meth:`append` writes a batch, :meth:`close` unlocks."""

    def __init__(self, path: str | os.PathLike, option: str = "--out"):
        self.path = os.fspath(path)
        self.option = option
        self.csv = self.path.lower().endswith(".csv")
        self._fd: int | None = None
        self._created = False

    @property
    def shown(self) -> str:
        return f"{self.option} {printable(self.path, 300)}"

    def _refuse(self, why: str) -> ConfigError:
        self.close()
        return ConfigError(
            f"{self.shown}: {why}; it is not a file written by `captioning caption --out` "
            "(refused, left as it is): give a new file name, or that command's own file to resume"
        )

    def check(self) -> NameSet:
        """The names already in the file (empty if there is none), after checking that it is a regular
        file that no other run is writing, and that it is this command's; a cut last line is removed.
        The file is created (empty) and stays locked until :meth:`close`. One-line ConfigError
        otherwise (nothing written)."""
        self._open()
        keys, complete = self._read_keys()
        if complete < os.fstat(self._fd).st_size:  # a line cut by a crash in the middle of its write
            os.ftruncate(self._fd, complete)
        return NameSet(keys)

    def _open(self) -> None:
        if self._fd is not None:
            return
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as err:
            raise ConfigError(f"{self.shown}: cannot read it ({err.strerror or err})") from None
        if mode is not None and stat.S_ISDIR(mode):
            raise ConfigError(f"{self.shown}: is a folder; give a file name (.jsonl, or .csv)")
        if mode is not None and not stat.S_ISREG(mode):
            raise ConfigError(
                f"{self.shown}: not a regular file (a pipe, a device or a terminal); give a file name (.jsonl, or .csv)"
            )
        if mode is None:
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                raise ConfigError(f"{self.shown}: no such folder {printable(parent, 300)}")
            if not os.access(parent, os.W_OK):
                raise ConfigError(f"{self.shown}: cannot write in {printable(parent, 300)} (permission denied)")
        elif not os.access(self.path, os.R_OK | os.W_OK):
            raise ConfigError(f"{self.shown}: cannot read and append to it (permission denied)")
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags | (0 if mode is not None else os.O_EXCL), 0o666)
        except OSError as err:
            raise ConfigError(f"{self.shown}: cannot open it ({err.strerror or err})") from None
        self._fd, self._created = fd, mode is None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a pipe since the check above
            raise self._refuse("not a regular file")
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self._created = False  # another run's file: never removed by this one
                self.close()
                raise ConfigError(
                    f"{self.shown}: another `captioning caption` run is writing to it (the file is locked); "
                    "wait for it to end, or give another file"
                ) from None

    def _records(self) -> Iterator[bytes]:
        """The file's raw records, each with its line end; a last one without it is a cut record. A CSV
        record spans lines while a quoted cell holds a line break (its quotes are then unbalanced)."""
        with os.fdopen(os.dup(self._fd), "rb") as f:
            f.seek(0)
            record = b""
            for raw in f:
                record += raw
                if self.csv and record.count(b'"') % 2:  # inside a quoted cell: the record goes on
                    continue
                yield record
                record = b""
            if record:
                yield record

    def _read_keys(self) -> tuple[list[int], int]:
        """The hashes of the names in the file and the byte length of its complete records."""
        keys: list[int] = []
        complete = 0
        for number, raw in enumerate(self._records(), 1):
            if not raw.endswith(b"\n"):
                self._check_cut(raw, number)
                break
            if number == 1 and self.csv:
                if raw != CSV_HEADER:
                    raise self._refuse(f"its first line is not the header {','.join(CSV_COLUMNS)}")
                complete += len(raw)
                continue
            text, strict = _decode(raw)
            name = self._csv_name(text, number, strict) if self.csv else self._json_name(text, number, strict)
            keys.append(name_key(name))
            complete += len(raw)
        return keys, complete

    def _check_cut(self, raw: bytes, number: int) -> None:
        """A last line without its line end is removed only when it can be the start of one of this
        command's lines (a write cut by a crash); another file's last line is refused."""
        if b"\0" in raw:
            raise self._refuse(f"line {number} holds NUL bytes")
        if self.csv and number == 1:
            ours = CSV_HEADER.startswith(raw)
        elif self.csv:
            ours = True  # any start of a record (the header above is this command's)
        else:
            ours = raw.startswith(JSON_START) or JSON_START.startswith(raw)
        if not ours:
            what = "the header " + ",".join(CSV_COLUMNS) if self.csv else "one of its JSON objects"
            raise self._refuse(f"line {number} is cut (no line end) and is not the start of {what}")

    def _json_name(self, text: str, number: int, strict: bool) -> str:
        try:
            row = parse_json(text, f"line {number}", ConfigError)  # malformed, nested, digits: refused
        except ConfigError:
            raise self._refuse(f"line {number} is not {'JSON' if strict else 'UTF-8 text'}") from None
        if not (
            isinstance(row, dict) and isinstance(row.get("image"), str) and ("generated_text" in row or "error" in row)
        ):
            raise self._refuse(f'line {number} is not an object with "image" and "generated_text" or "error"')
        return row["image"]

    def _csv_name(self, text: str, number: int, strict: bool) -> str:
        try:
            rows = list(csv.reader(io.StringIO(text, newline="")))
        except (csv.Error, ValueError):
            raise self._refuse(f"line {number} is not a CSV row") from None
        if len(rows) != 1 or len(rows[0]) != len(CSV_COLUMNS):
            found = len(rows[0]) if len(rows) == 1 else f"{len(rows)} rows,"
            raise self._refuse(f"line {number} has {found} columns, not {len(CSV_COLUMNS)}")
        return unescape_cell(rows[0][0])

    @staticmethod
    def _json_line(row: dict) -> bytes:
        try:
            return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no file name gives: kept as JSON's \ud800 escape
            return (json.dumps(row) + "\n").encode()

    def _encode(self, rows: Sequence[dict], header: bool) -> bytes:
        if not self.csv:
            return b"".join(self._json_line(r) for r in rows)
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if header:
            writer.writerow(CSV_COLUMNS)
        for r in rows:
            score = r.get("score", "")
            writer.writerow([escape_cell(str(r.get(k) or "")) if k != "score" else score for k in CSV_COLUMNS])
        text = buffer.getvalue()
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace")

    def append(self, rows: Sequence[dict]) -> None:
        """Append one batch's lines with one write (the file is opened and locked by :meth:`check`,
        or here if it was not called)."""
        if not rows:
            return
        self._open()
        header = self.csv and os.fstat(self._fd).st_size == 0
        data = memoryview(self._encode(rows, header))
        while data:  # a regular file takes it whole; a short write goes on where it stopped
            written = os.write(self._fd, data)
            data = data[written:]

    def close(self) -> None:
        """Unlock and close the file; a file this run created and never wrote to is removed."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if self._created and os.fstat(fd).st_size == 0:
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)  # the lock goes with the file's last descriptor

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
