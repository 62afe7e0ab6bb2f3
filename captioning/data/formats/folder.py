"""A plain folder of images with a captions file: CSV (header ``image,caption[,split]``) or JSON lines
(``{"image": ..., "caption": ..., "split"?: ...}``), one caption per row.

Rows of the same image are grouped into one :class:`ImageRecord` (in order of first appearance;
``imgid`` = ``image_id`` = that order). A file that names no split on any row gets a held-out part:
:func:`hold_out` puts a tenth of its images (at least one each, from three images on) in ``val`` and a
tenth in ``test``, chosen with a fixed seed so every run of the same file gets the same parts, and says
so in one line on stderr.
"""

from __future__ import annotations

import csv
import os
import random
import sys

from captioning.common import PathLike
from captioning.data.formats.base import FORMATS, AnnotationFormat, check_text, image_path
from captioning.data.records import SPLITS, ImageRecord
from captioning.errors import AnnotationError
from captioning.files import parse_json
from captioning.tokenizers import tokenize

FOLDER_SUFFIXES = (".csv", ".jsonl")


def _rows(path: str):
    """(line number, row dict) of a CSV or JSON-lines file."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        if path.lower().endswith(".csv"):
            reader = csv.DictReader(f)
            fields = [c.strip() for c in (reader.fieldnames or [])]
            for need in ("image", "caption"):
                if need not in fields:
                    raise AnnotationError(
                        f"{path}: the header has no column {need!r} (found {fields}); expected image,caption[,split]"
                    )
            for row in reader:
                yield reader.line_num, {k.strip(): v for k, v in row.items() if k is not None}
        else:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = parse_json(line, f"{path}: line {n}", AnnotationError)  # any line: one line of error
                if not isinstance(row, dict):
                    raise AnnotationError(f'{path}: line {n}: expected an object {{"image", "caption"}}')
                yield n, row


#: the seed and the share of the images :func:`hold_out` puts in each of val and test
HOLD_OUT_SEED, HOLD_OUT_SHARE = 0, 0.1


def hold_out(path: str, records: list[ImageRecord]) -> None:
    """Split a file that names no split: a seeded tenth of the images to ``val``, a tenth to ``test``."""
    if len(records) < 3:
        return
    n = max(1, round(HOLD_OUT_SHARE * len(records)))
    order = random.Random(HOLD_OUT_SEED).sample(range(len(records)), len(records))
    for i in order[:n]:
        records[i].split = "val"
    for i in order[n : 2 * n]:
        records[i].split = "test"
    print(
        f"{path}: no split column: {n} of {len(records)} images held out for val and {n} for test "
        f"(seed {HOLD_OUT_SEED}); give a split column (train, val, test) to choose them",
        file=sys.stderr,
    )


def _add_row(path: str, line: int, row: dict, records: dict, merge_restval: bool) -> None:
    """Add one row's caption to its image's record (made on its first row)."""
    image, caption, split = row.get("image"), row.get("caption"), row.get("split") or "train"
    if not isinstance(image, str) or not image.strip():
        raise AnnotationError(f"{path}: line {line}: missing or empty field 'image'")
    if caption is not None and not isinstance(caption, str):
        raise AnnotationError(f"{path}: line {line}: field 'caption' must be a string")
    if caption is not None:
        check_text(caption, f"{path}: line {line}: field 'caption'")
    split = str(split).strip()
    if split not in SPLITS:
        raise AnnotationError(f"{path}: line {line}: unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    if merge_restval and split == "restval":
        split = "train"
    rel = image_path(path, f"line {line}", image.strip())
    rec = records.get(rel)
    if rec is None:
        n = len(records)
        rec = records[rel] = ImageRecord(n, n, rel, split, [], [])
    elif rec.split != split:
        raise AnnotationError(f"{path}: line {line}: {rel} is in split {split!r} here but {rec.split!r} earlier")
    words = tokenize(caption or "")
    if words:
        rec.captions.append(" ".join(caption.split()))
        rec.tokens.append(words)


def load_folder(path: PathLike, merge_restval: bool = True, problems: list | None = None) -> list[ImageRecord]:
    """ImageRecords of a captions CSV / JSON-lines file; paths are relative to the images folder.

    Given a ``problems`` list, a problem of one row is appended to it and the row left out, so that
    every problem is found in one reading; a problem of the whole file still raises."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise AnnotationError(f"{path}: no such file")
    records: dict[str, ImageRecord] = {}
    named_split = False
    try:
        for line, row in _rows(path):
            named_split = named_split or bool(row.get("split"))
            try:
                _add_row(path, line, row, records, merge_restval)
            except AnnotationError as err:
                if problems is None:
                    raise
                problems.append(str(err))
    except UnicodeDecodeError:
        raise AnnotationError(f"{path}: not UTF-8 text") from None
    except csv.Error as err:
        raise AnnotationError(f"{path}: malformed CSV ({err})") from None
    empty = [r.path for r in records.values() if not r.captions]
    if empty:
        message = f"{path}: {len(empty)} image(s) without a usable caption, e.g. {empty[:3]}"
        if problems is None:
            raise AnnotationError(message)
        problems.append(message)
        records = {k: r for k, r in records.items() if r.captions}
    if not records:
        raise AnnotationError(f"{path}: no rows")
    result = list(records.values())
    if not named_split:
        hold_out(path, result)
    return result


@FORMATS.register("folder")
class FolderFormat(AnnotationFormat):
    """A captions CSV or JSON-lines file (told by its suffix) beside a folder of images."""

    description = "a captions CSV / JSON-lines file"
    priority = 30

    def detect(self, path: str) -> bool:
        return path.lower().endswith(FOLDER_SUFFIXES)

    def load(self, paths, split_file, merge_restval, problems):
        return load_folder(paths[0], merge_restval, problems)
