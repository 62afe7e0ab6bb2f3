"""Reading Karpathy split files (dataset_coco.json, dataset_flickr8k.json, dataset_flickr30k.json,
and our shapes set).

Format: ``{"images": [{"filepath"?, "filename", "imgid", "split", "cocoid"?, "sentences": [{"tokens",
"raw"}, ...], "width"?, "height"?, "objects"?}, ...]}``. Every problem is an :class:`AnnotationError`
naming the file and the field path, e.g. ``ann.json: images[3]: missing field 'sentences'``.
"""

from __future__ import annotations

import os
from typing import Any

from captioning.data.annotation_format import (
    FORMATS,
    AnnotationFormat,
    check_id,
    check_image_size,
    check_objects,
    check_text,
    check_texts,
    image_path,
    read_json,
)
from captioning.data.records import SPLITS, ImageRecord
from captioning.errors import AnnotationError
from captioning.tokenizers import tokenize


def _captions(path: str, where: str, sentences: Any) -> tuple[list[str], list[list[str]]]:
    """(raw captions, token lists) of one image; empty and whitespace-only captions are skipped."""
    if not isinstance(sentences, list):
        raise AnnotationError(f"{path}: {where}.sentences: expected a list, got {type(sentences).__name__}")
    captions, tokens = [], []
    for j, s in enumerate(sentences):
        at = f"{where}.sentences[{j}]"
        if not isinstance(s, dict):
            raise AnnotationError(f"{path}: {at}: expected an object, got {type(s).__name__}")
        raw, toks = s.get("raw"), s.get("tokens")
        if raw is None and toks is None:
            raise AnnotationError(f"{path}: {at}: missing field 'tokens' or 'raw'")
        if raw is not None and not isinstance(raw, str):
            raise AnnotationError(f"{path}: {at}.raw: expected a string, got {type(raw).__name__}")
        if raw is not None:
            check_text(raw, f"{path}: {at}.raw")
        if toks is not None:
            if not isinstance(toks, list) or not all(isinstance(t, str) for t in toks):
                raise AnnotationError(f"{path}: {at}.tokens: expected a list of strings")
            check_texts(toks, f"{path}: {at}.tokens")
            words = [t.strip().lower() for t in toks if t.strip()]
        else:
            words = tokenize(raw)
        if not words:
            continue  # an empty caption: nothing to learn from or score against
        captions.append(raw.strip() if raw is not None and raw.strip() else " ".join(words))
        tokens.append(words)
    return captions, tokens


def _record(path: str, i: int, img: Any, merge_restval: bool) -> ImageRecord:
    where = f"images[{i}]"
    if not isinstance(img, dict):
        raise AnnotationError(f"{path}: {where}: expected an object, got {type(img).__name__}")
    for name in ("filename", "split", "sentences"):
        if name not in img:
            raise AnnotationError(f"{path}: {where}: missing field {name!r}")
    filename, filepath, split = img["filename"], img.get("filepath", ""), img["split"]
    if not isinstance(filename, str) or not filename.strip():
        raise AnnotationError(f"{path}: {where}.filename: expected a non-empty string")
    if not isinstance(filepath, str):
        raise AnnotationError(f"{path}: {where}.filepath: expected a string")
    if split not in SPLITS:
        raise AnnotationError(f"{path}: {where}.split: unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    imgid = img.get("imgid", i)
    image_id = img.get("cocoid", imgid)
    for name, value in (("imgid", imgid), ("cocoid", image_id)):
        check_id(value, f"{path}: {where}.{name}")
    check_image_size(img.get("width"), img.get("height"), f"{path}: {where}")
    objects = check_objects(img.get("objects"), f"{path}: {where}.objects")
    rel = image_path(path, where, filepath, filename)
    captions, tokens = _captions(path, where, img["sentences"])
    if not captions:
        raise AnnotationError(f"{path}: {where} ({rel}): no usable captions (all missing or empty)")
    if merge_restval and split == "restval":
        split = "train"
    return ImageRecord(imgid, image_id, rel, split, captions, tokens, objects, img.get("width"), img.get("height"))


def load_karpathy(
    path: str | os.PathLike[str], merge_restval: bool = True, problems: list | None = None
) -> list[ImageRecord]:
    """Every image of a Karpathy split file, in file order; ``restval`` becomes ``train`` if ``merge_restval``.

    Raises :class:`AnnotationError` for a missing or malformed file, a missing or ill-typed field,
    an unknown split, an image without a usable caption, or an image listed twice (same imgid,
    image_id or path). Given a ``problems`` list, a problem of one image is appended to it (one
    line each) and the image left out instead, so that every problem of the file is found in one
    reading; a problem of the whole file still raises.
    """
    path = os.fspath(path)
    data = read_json(path)
    if not isinstance(data, dict) or "images" not in data:
        raise AnnotationError(f"{path}: missing top-level field 'images' (not a Karpathy split file?)")
    if not isinstance(data["images"], list):
        raise AnnotationError(f"{path}: images: expected a list, got {type(data['images']).__name__}")
    records: list[ImageRecord] = []
    seen: dict[tuple[str, Any], int] = {}  # (key, value) -> index of the first image with it
    for i, img in enumerate(data["images"]):
        try:
            rec = _record(path, i, img, merge_restval)
            for key, value in (("imgid", rec.imgid), ("image_id", rec.image_id), ("path", rec.path)):
                if (key, value) in seen:
                    raise AnnotationError(
                        f"{path}: images[{i}]: image listed twice ({key} {value!r} already used by images[{seen[key, value]}])"
                    )
            for key, value in (("imgid", rec.imgid), ("image_id", rec.image_id), ("path", rec.path)):
                seen[key, value] = i
        except AnnotationError as err:
            if problems is None:
                raise
            problems.append(str(err))
            continue
        records.append(rec)
    return records


@FORMATS.register("karpathy")
class KarpathyFormat(AnnotationFormat):
    """A Karpathy split JSON: any other non-empty file (the fallback, asked last)."""

    description = "a Karpathy split file"
    priority = 100

    def detect(self, path: str) -> bool:
        return os.path.isfile(path) and os.path.getsize(path) > 0

    def load(self, paths, split_file, merge_restval, problems):
        return load_karpathy(paths[0], merge_restval=merge_restval, problems=problems)
