"""Reading Karpathy split files (dataset_coco.json, dataset_flickr8k.json, dataset_flickr30k.json,
and our shapes set).

Format: ``{"images": [{"filepath"?, "filename", "imgid", "split", "cocoid"?, "sentences": [{"tokens",
"raw"}, ...], "width"?, "height"?, "objects"?}, ...]}``. Every problem is an :class:`AnnotationError`
naming the file and the field path, e.g. ``ann.json: images[3]: missing field 'sentences'``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from captioning.errors import AnnotationError, ConfigError
from captioning.files import require_file
from captioning.vocab import tokenize

SPLITS = ("train", "val", "test", "restval")


@dataclass
class ImageRecord:
    """One image and its reference captions; ``path`` is relative to the images root."""

    imgid: int
    image_id: int  # cocoid if present, else imgid: the id used in results files and metrics
    path: str
    split: str
    captions: list[str]  # raw reference captions (empty ones dropped)
    tokens: list[list[str]]  # lower-cased words, parallel to captions
    objects: list[dict] = field(default_factory=list)
    width: Optional[int] = None
    height: Optional[int] = None


def is_int(x: Any) -> bool:
    """An integer of JSON (True and False are not)."""
    return isinstance(x, int) and not isinstance(x, bool)


def read_json(path: str) -> Any:
    """A JSON annotation file, with one-line AnnotationErrors for a missing, unreadable or malformed file."""
    require_file(path, AnnotationError, "an annotation file")
    try:
        with open(path, encoding="utf-8-sig") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise AnnotationError(f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except UnicodeDecodeError:
        raise AnnotationError(f"{path}: not UTF-8 text (is it really a JSON annotation file?)") from None
    except RecursionError:
        raise AnnotationError(f"{path}: JSON nested too deeply to be an annotation file") from None
    except OSError as err:
        raise AnnotationError(f"{path}: cannot read ({err.strerror or err})") from None


def image_path(path: str, where: str, *parts: str) -> str:
    """A record's image path, relative to the images folder: normalised, and refused (one line naming
    ``where`` in the annotation file ``path``) when absolute or above the folder (``..``)."""
    rel = os.path.normpath(os.path.join(*parts))
    if os.path.isabs(rel) or os.path.splitdrive(rel)[0] or rel in (".", "..") or rel.startswith(".." + os.sep):
        raise AnnotationError(f"{path}: {where}: image path {rel!r} is outside the images folder (absolute, "
                              "or '..' above it); give paths relative to --data.images_root")
    return rel


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
        if toks is not None:
            if not isinstance(toks, list) or not all(isinstance(t, str) for t in toks):
                raise AnnotationError(f"{path}: {at}.tokens: expected a list of strings")
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
        if not is_int(value):
            raise AnnotationError(f"{path}: {where}.{name}: expected an integer, got {value!r}")
    for name in ("width", "height"):
        if img.get(name) is not None and not is_int(img[name]):
            raise AnnotationError(f"{path}: {where}.{name}: expected an integer, got {img[name]!r}")
    objects = img.get("objects") or []
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        raise AnnotationError(f"{path}: {where}.objects: expected a list of objects")
    rel = image_path(path, where, filepath, filename)
    captions, tokens = _captions(path, where, img["sentences"])
    if not captions:
        raise AnnotationError(f"{path}: {where} ({rel}): no usable captions (all missing or empty)")
    if merge_restval and split == "restval":
        split = "train"
    return ImageRecord(imgid, image_id, rel, split, captions, tokens, objects, img.get("width"), img.get("height"))


def load_karpathy(path: Union[str, "os.PathLike[str]"], merge_restval: bool = True,
                  problems: Optional[list] = None) -> list[ImageRecord]:
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


def split_records(records: Sequence[ImageRecord], split: str) -> list[ImageRecord]:
    """The records of one split (``train`` includes restval once merged)."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    return [r for r in records if r.split == split]
