"""Raw COCO caption files (captions_train2014.json, captions_val2014.json, ...) through pycocotools.

``load_coco`` gives the same :class:`ImageRecord` list as a Karpathy split file. Paths are
``<folder>/<file_name>`` where ``<folder>`` comes from the caption file's name (captions_train2014.json
-> train2014/), matching the layout of the COCO downloads and Karpathy's ``filepath`` field.

Splits: with a split file (Karpathy's dataset_coco.json, or ``{"train": [cocoid, ...], "val": [...],
"test": [...]}``) each image takes the split its cocoid has there and images it does not list are
left out; without one, the caption file's name decides (train/val/test in it).
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import re
from collections.abc import Sequence

from captioning.common import PathLike
from captioning.data.formats.base import (
    FORMATS,
    AnnotationFormat,
    check_id,
    check_image_size,
    check_text,
    image_path,
    is_int,
    read_json,
)
from captioning.data.records import SPLITS, ImageRecord
from captioning.errors import AnnotationError
from captioning.tokenizers import tokenize

_COCO_KEY = re.compile(rb'"annotations"\s*:')


def _report(message: str, problems: list | None) -> None:
    """A problem of one image or entry: raised, or (given a ``problems`` list) noted and left out."""
    if problems is None:
        raise AnnotationError(message)
    problems.append(message)


def _coco(path: str, data: dict, problems: list | None = None):
    """A pycocotools COCO object over already-parsed data (its own loader would read the file again).
    Malformed entries are errors, or with a ``problems`` list noted there and left out."""
    from pycocotools.coco import COCO

    if not isinstance(data, dict):
        raise AnnotationError(
            f"{path}: expected a JSON object with 'images' and 'annotations' (not a COCO caption file?)"
        )
    for key in ("images", "annotations"):
        if not isinstance(data.get(key), list):
            raise AnnotationError(f"{path}: missing or ill-typed top-level field {key!r} (not a COCO caption file?)")
    annotations, images = [], []
    for i, ann in enumerate(data["annotations"]):
        try:
            if not isinstance(ann, dict) or not {"id", "image_id", "caption"} <= ann.keys():
                raise AnnotationError(
                    f"{path}: annotations[{i}]: expected an object with 'id', 'image_id' and 'caption'"
                )
            check_id(ann["image_id"], f"{path}: annotations[{i}].image_id")
            if isinstance(ann["caption"], str):
                check_text(ann["caption"], f"{path}: annotations[{i}].caption")
        except AnnotationError as err:
            _report(str(err), problems)
            continue
        annotations.append(ann)
    for i, img in enumerate(data["images"]):
        try:
            if not isinstance(img, dict) or not {"id", "file_name"} <= img.keys():
                raise AnnotationError(f"{path}: images[{i}]: expected an object with 'id' and 'file_name'")
            check_id(img["id"], f"{path}: images[{i}].id")
            if not isinstance(img["file_name"], str) or not img["file_name"].strip():
                raise AnnotationError(f"{path}: images[{i}].file_name: expected a non-empty string")
            check_image_size(img.get("width"), img.get("height"), f"{path}: images[{i}]")
        except AnnotationError as err:
            _report(str(err), problems)
            continue
        images.append(img)
    coco = COCO()
    coco.dataset = {**data, "annotations": annotations, "images": images}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        coco.createIndex()
    return coco


def read_split_file(path: PathLike, merge_restval: bool = True) -> dict[int, str]:
    """cocoid -> split from Karpathy's dataset_coco.json or a ``{split: [cocoid, ...]}`` file."""
    path = os.fspath(path)
    data = read_json(path)
    splits: dict[int, str] = {}
    if isinstance(data, dict) and isinstance(data.get("images"), list):
        for i, img in enumerate(data["images"]):
            if not isinstance(img, dict) or "cocoid" not in img or "split" not in img:
                raise AnnotationError(f"{path}: images[{i}]: missing field 'cocoid' or 'split'")
            if not is_int(img["cocoid"]):
                raise AnnotationError(f"{path}: images[{i}].cocoid: expected an integer, got {img['cocoid']!r}")
            splits[img["cocoid"]] = img["split"]
    elif isinstance(data, dict):
        for split, ids in data.items():
            if not isinstance(ids, list) or not all(is_int(i) for i in ids):
                raise AnnotationError(f"{path}: {split!r}: expected a list of cocoids (integers)")
            splits.update({i: split for i in ids})
    else:
        raise AnnotationError(f"{path}: expected a Karpathy split file or an object {{split: [cocoid, ...]}}")
    for cocoid, split in splits.items():
        if split not in SPLITS:
            raise AnnotationError(
                f"{path}: cocoid {cocoid}: unknown split {split!r} (expected one of {', '.join(SPLITS)})"
            )
    if merge_restval:
        splits = {k: "train" if v == "restval" else v for k, v in splits.items()}
    return splits


def _folder(path: str) -> str:
    m = re.match(r"captions_(\w+?)\.json$", os.path.basename(path))
    return m.group(1) if m else ""


def _split_from_name(path: str) -> str:
    name = os.path.basename(path).lower()
    for split in ("train", "val", "test"):
        if split in name:
            return split
    raise AnnotationError(f"{path}: cannot tell the split from the file name; give a split file (--data.split_file)")


def load_coco(
    captions_files: PathLike | Sequence[PathLike],
    split_file: PathLike | None = None,
    merge_restval: bool = True,
    data: dict | None = None,
    problems: list | None = None,
) -> list[ImageRecord]:
    """Every captioned image of the COCO caption files, ordered by cocoid.

    Raises :class:`AnnotationError` for a missing or malformed file, an image listed in two files,
    an image without a usable caption, or split-file cocoids that no caption file has. Given a
    ``problems`` list, the problems of single images and entries are noted there (each once) and
    those left out, instead of stopping at the first (``captioning prepare``).
    """
    files = (
        [os.fspath(captions_files)]
        if isinstance(captions_files, (str, os.PathLike))
        else [os.fspath(f) for f in captions_files]
    )
    splits = read_split_file(split_file, merge_restval) if split_file else None
    records: dict[int, ImageRecord] = {}
    where: dict[int, str] = {}
    seen: set[int] = set()  # every cocoid of the caption files, usable or not
    for path in files:
        coco = _coco(path, data if data is not None and len(files) == 1 else read_json(path), problems)
        folder, default_split = _folder(path), None if splits else _split_from_name(path)
        for cocoid, img in coco.imgs.items():
            cocoid = int(cocoid)
            if splits is not None and cocoid not in splits:
                continue
            seen.add(cocoid)
            if cocoid in records:
                _report(f"{path}: image {cocoid} is also in {where[cocoid]}", problems)
                continue
            captions, tokens = [], []
            for ann in coco.imgToAnns.get(cocoid, []):
                raw = ann["caption"] if isinstance(ann["caption"], str) else ""
                words = tokenize(raw)
                if words:
                    captions.append(" ".join(raw.split()))
                    tokens.append(words)
            try:
                rel = image_path(path, f"image {cocoid}", folder, img["file_name"])
            except AnnotationError as err:
                _report(str(err), problems)
                continue
            if not captions:
                _report(f"{path}: image {cocoid} ({rel}): no usable captions", problems)
                continue
            split = splits[cocoid] if splits is not None else default_split
            records[cocoid] = ImageRecord(
                0, cocoid, rel, split, captions, tokens, [], img.get("width"), img.get("height")
            )
            where[cocoid] = path
    if splits is not None:
        lost = sorted(set(splits) - seen)  # (an image left out for a problem of its own is reported already)
        if lost:
            _report(
                f"{split_file}: {len(lost)} cocoid(s) are in no caption file (e.g. {lost[:5]}); "
                f"pass every caption file the split uses (captions_train2014.json and captions_val2014.json)",
                problems,
            )
    out = [records[k] for k in sorted(records)]
    for i, r in enumerate(out):
        r.imgid = i
    return out


@FORMATS.register("coco")
class CocoFormat(AnnotationFormat):
    """Raw COCO caption JSON: a JSON file with a top-level ``"annotations"`` key (found by a scan, not a
    parse: the reader parses once); several files read together, splits from a split file or the names."""

    description = "COCO caption files"
    priority = 40
    several = True
    takes_split_file = True

    def detect(self, path: str) -> bool:
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            return False
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _COCO_KEY.search(m) is not None

    def load(self, paths, split_file, merge_restval, problems):
        return load_coco(paths, split_file, merge_restval, problems=problems)
