"""Reading Karpathy split files (dataset_coco.json, dataset_flickr8k.json, dataset_flickr30k.json,
and our shapes set).

Format: ``{"images": [{"filepath"?, "filename", "imgid", "split", "cocoid"?, "sentences": [{"tokens",
"raw"}, ...], "width"?, "height"?, "objects"?}, ...]}``. Every problem is an :class:`AnnotationError`
naming the file and the field path, e.g. ``ann.json: images[3]: missing field 'sentences'``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from captioning.data.formats.base import (
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
from captioning.files import require_file
from captioning.tokenizers import tokenize


def _captions(
    path: str, where: str, sentences: Any, words_of: dict[str, str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """(raw captions, token lists) of one image; empty and whitespace-only captions are skipped.
    ``words_of``: each token seen so far -> its word (stripped, lower-cased, interned; "" for none),
    shared by the images of a file: the common sentence (``raw`` and ``tokens`` strings, ASCII)
    is read without a check per token."""
    if not isinstance(sentences, list):
        raise AnnotationError(f"{path}: {where}.sentences: expected a list, got {type(sentences).__name__}")
    captions, tokens = [], []
    for j, s in enumerate(sentences):
        if words_of is not None and type(s) is dict:
            raw, toks = s.get("raw"), s.get("tokens")
            if type(raw) is str and type(toks) is list:
                try:
                    joined = " ".join(toks)  # a TypeError for a token that is no string
                except TypeError:
                    joined = None
                if joined is not None and raw.isascii() and joined.isascii():  # no lone surrogate in either
                    try:
                        words = [words_of[t] for t in toks]
                    except KeyError:
                        words = [words_of.get(t) or words_of.setdefault(t, sys.intern(t.strip().lower())) for t in toks]
                    if "" in words:
                        words = [w for w in words if w]
                    if words:
                        stripped = raw.strip()
                        captions.append(stripped if stripped else " ".join(words))
                        tokens.append(words)
                    continue
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


def _record(path: str, i: int, img: Any, merge_restval: bool, words_of: dict[str, str] | None = None) -> ImageRecord:
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
    captions, tokens = _captions(path, where, img["sentences"], words_of)
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

    The file's ``images`` are parsed one at a time (:func:`_streamed_images`), each made a record
    before the next is read, so that the whole file's parse is never held beside the records (what
    it saves: docs/PERFORMANCE.md, "COCO-sized data"). A file that is not a plain JSON object with
    one ``images`` list is read whole, as before, and any error is that reading's.
    """
    path = os.fspath(path)
    require_file(path, AnnotationError, "an annotation file")
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        text = None  # read_json says what is wrong
    if text is not None:
        try:
            return _records(path, _streamed_images(text), merge_restval, problems)
        except _NotPlain:
            pass
        finally:
            del text
    data = read_json(path)
    if not isinstance(data, dict) or "images" not in data:
        raise AnnotationError(f"{path}: missing top-level field 'images' (not a Karpathy split file?)")
    if not isinstance(data["images"], list):
        raise AnnotationError(f"{path}: images: expected a list, got {type(data['images']).__name__}")
    return _records(path, data["images"], merge_restval, problems)


def _records(path: str, images: Iterable, merge_restval: bool, problems: list | None) -> list[ImageRecord]:
    """The records of a Karpathy file's images (see :func:`load_karpathy`); ``problems`` is only
    added to once every image is read."""
    found: list[str] = []
    records: list[ImageRecord] = []
    seen: dict[tuple[str, Any], int] = {}  # (key, value) -> index of the first image with it
    words_of: dict[str, str] = {}
    for i, img in enumerate(images):
        try:
            rec = _record(path, i, img, merge_restval, words_of)
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
            found.append(str(err))
            continue
        records.append(rec)
    if problems is not None:
        problems.extend(found)
    return records


class _NotPlain(Exception):
    """The text is not a plain JSON object with one ``images`` list (or not valid JSON)."""


_SPACE = re.compile(r"[ \t\n\r]*")


def _streamed_images(text: str) -> Iterator[Any]:
    """The values of the ``images`` list of the JSON object ``text``, parsed one at a time (by
    json's own decoder); :class:`_NotPlain` as soon as the text is anything else: another top
    level, ``images`` twice or not a list, invalid JSON anywhere (also after the images)."""
    decoder = json.JSONDecoder()

    def space(i: int) -> int:
        return _SPACE.match(text, i).end()

    def value(i: int) -> tuple[Any, int]:
        try:
            return decoder.raw_decode(text, i)
        except (ValueError, RecursionError):  # json.JSONDecodeError is a ValueError
            raise _NotPlain from None

    i = space(0)
    if text[i : i + 1] != "{":
        raise _NotPlain
    i, found = space(i + 1), False
    while True:
        key, i = value(i)
        i = space(i)
        if not isinstance(key, str) or text[i : i + 1] != ":":
            raise _NotPlain
        i = space(i + 1)
        if key != "images":
            _, i = value(i)
        elif found or text[i : i + 1] != "[":
            raise _NotPlain
        else:
            found, i = True, space(i + 1)
            if text[i : i + 1] == "]":
                i += 1
            else:
                while True:
                    image, i = value(i)
                    yield image
                    i = space(i)
                    if text[i : i + 1] == "]":
                        i += 1
                        break
                    if text[i : i + 1] != ",":
                        raise _NotPlain
                    i = space(i + 1)
        i = space(i)
        if text[i : i + 1] == "}":
            break
        if text[i : i + 1] != ",":
            raise _NotPlain
        i = space(i + 1)
    if not found or space(i + 1) != len(text):
        raise _NotPlain


@FORMATS.register("karpathy")
class KarpathyFormat(AnnotationFormat):
    """A Karpathy split JSON: any other non-empty file (the fallback, asked last)."""

    description = "a Karpathy split file"
    priority = 100

    def detect(self, path: str) -> bool:
        return os.path.isfile(path) and os.path.getsize(path) > 0

    def load(self, paths, split_file, merge_restval, problems):
        return load_karpathy(paths[0], merge_restval=merge_restval, problems=problems)
