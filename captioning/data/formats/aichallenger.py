"""AI Challenger 2017's Chinese captions, read as they ship.

Layout: ``caption_<split>_annotations_<date>.json``, a JSON list of
``{"url": str, "image_id": "<40 hex>.jpg", "caption": [five raw sentences]}``, with the images in
the folder ``caption_<split>_images_<date>/`` beside the file. Several files are read together
(train and validation, as COCO's); each file's split comes from its name (``train``;
``validation`` or ``val``; ``test``, which includes ``test_a`` / ``test_b``). The files lie in one
folder, or each in the dated folder its archive unpacks to (``ai_challenger_caption_train_20170902/``,
``ai_challenger_caption_validation_20170910/``, side by side): the images root is then the folder
that holds those (:func:`release_root`), and image paths start with the dated folder.

The sentences have no spaces: the data's tokenizer splits them (``jieba`` is picked for them when
none is named, data/tokens.py). The records' image ids are their positions; each image's own id, its
``image_id`` file name, is kept beside them (``Annotations.dataset_ids``), and results files name the
images by it (evaluation/results_files.py: results_items, cover_split).
"""

from __future__ import annotations

import os
import re

from captioning.data.formats.base import (
    FORMATS,
    AnnotationFormat,
    Annotations,
    check_text,
    image_path,
    read_json,
    shown,
)
from captioning.data.records import ImageRecord
from captioning.errors import AnnotationError
from captioning.tokenizers import tokenize

_NAME = re.compile(r"caption_(?P<split>[a-z_]+?)_annotations_(?P<date>\w+)\.json$", re.IGNORECASE)
_SPLITS = {"train": "train", "training": "train", "validation": "val", "val": "val", "valid": "val"}
_HEAD = re.compile(rb'^\s*(\xef\xbb\xbf)?\s*\[\s*\{[^\[\]{}]*"(image_id|caption|url)"')


def split_of(path: str) -> str:
    """The split a file's name says (caption_train_... -> train, caption_validation_... -> val, test*)."""
    match = _NAME.search(os.path.basename(path))
    part = match.group("split").lower() if match else ""
    if part in _SPLITS:
        return _SPLITS[part]
    if part.startswith("test"):
        return "test"
    raise AnnotationError(
        f"{path}: cannot tell the split from the file name (expected caption_<train|validation|test>_annotations_<date>.json)"
    )


def images_folder(path: str) -> str:
    """The images folder beside an annotation file: caption_X_annotations_D.json -> caption_X_images_D/."""
    name = os.path.basename(path)
    match = _NAME.search(name)
    folder = f"caption_{match.group('split')}_images_{match.group('date')}" if match else ""
    if not folder or not os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(path)), folder)):
        raise AnnotationError(
            f"{path}: no images folder {folder or 'caption_<split>_images_<date>'}/ beside it "
            "(AI Challenger's images unpack there)"
        )
    return folder


#: the folder an AI Challenger archive unpacks to: ai_challenger_caption_<split>_<date>
_RELEASE_FOLDER = re.compile(r"ai_challenger_caption_[a-z_]+_\w+$", re.IGNORECASE)


def release_root(path: str) -> str:
    """The images root of an AI Challenger file: the folder that holds its dated release folder
    (``.../ai_challenger_caption_train_20170902/caption_train_annotations_20170902.json`` -> ``...``),
    else the file's own folder."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.dirname(folder) if _RELEASE_FOLDER.match(os.path.basename(folder)) else folder


def load_aichallenger(
    paths: list[str], merge_restval: bool = True, problems: list | None = None, names: dict | None = None
) -> list[ImageRecord]:
    """The records of AI Challenger caption files (see the module's docstring); image paths are
    relative to :func:`release_root` (the same for every file). ``names``: filled with each
    record's image_id -> the file's ``image_id`` (the dataset's own id)."""
    root = release_root(paths[0])
    records: list[ImageRecord] = []
    seen: dict[str, str] = {}
    for path in paths:
        if release_root(path) != root:
            raise AnnotationError(
                f"{path}: AI Challenger files read together lie in one folder, or each in its dated folder "
                f"(ai_challenger_caption_<split>_<date>/) side by side, as the archives unpack; this one is not "
                f"beside {paths[0]}"
            )
        split, folder = split_of(path), images_folder(path)
        inside = os.path.relpath(os.path.dirname(os.path.abspath(path)), root)  # "." or the dated folder
        folder = folder if inside == "." else os.path.join(inside, folder)
        data = read_json(path)
        if not isinstance(data, list):
            raise AnnotationError(f'{path}: expected a JSON list of {{"image_id", "caption"}} objects (AI Challenger)')
        for k, item in enumerate(data):
            try:
                records.append(_record(path, k, item, split, folder, len(records)))
            except AnnotationError as err:
                if problems is None:
                    raise
                problems.append(str(err))
                continue
            name = records[-1].path
            if name in seen:
                message = f"{path}: [{k}]: image {name!r} is also listed in {seen[name]}"
                records.pop()
                if problems is None:
                    raise AnnotationError(message)
                problems.append(message)
                continue
            seen[name] = path
            if names is not None:
                names[records[-1].image_id] = data[k]["image_id"].strip()
    return records


def _record(path: str, k: int, item, split: str, folder: str, index: int) -> ImageRecord:
    at = f"{path}: [{k}]"
    if not isinstance(item, dict):
        raise AnnotationError(f"{at}: expected an object with 'image_id' and 'caption', got {shown(item)}")
    for field in ("image_id", "caption"):
        if field not in item:
            raise AnnotationError(f"{at}: missing field {field!r}")
    name, captions = item["image_id"], item["caption"]
    if not isinstance(name, str) or not name.strip():
        raise AnnotationError(f"{at}.image_id: expected an image file name (a string), got {shown(name)}")
    if isinstance(captions, str):
        captions = [captions]
    if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
        raise AnnotationError(f"{at}.caption: expected a list of strings, got {shown(captions)}")
    kept = [" ".join(c.split()) for c in captions if tokenize(c)]
    for c in kept:
        check_text(c, f"{at}.caption")
    if not kept:
        raise AnnotationError(f"{at}: image {name!r} has no usable captions")
    rel = image_path(path, f"[{k}]", folder, name.strip())
    return ImageRecord(index, index, rel, split, kept, [tokenize(c) for c in kept])


@FORMATS.register("aichallenger")
class AIChallengerFormat(AnnotationFormat):
    """AI Challenger 2017 caption files: a JSON list of {"url", "image_id", "caption": [...]} (found by
    the file's first bytes), several read together, the split from each file's name."""

    description = "AI Challenger caption files"
    priority = 35
    several = True

    def detect(self, path: str) -> bool:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as f:
            head = f.read(4096)
        return _HEAD.match(head) is not None

    def load(self, paths, split_file, merge_restval, problems):
        return load_aichallenger(paths, merge_restval, problems)

    def default_images_root(self, path: str) -> str:
        """The folder that holds the dated release folders, or the file's folder (:func:`release_root`)."""
        return release_root(path)

    def read(self, paths, split_file=None, merge_restval=True, problems=None) -> Annotations:
        """The records, with each image's own id (its file name) as ``dataset_ids``."""
        names: dict[int, str] = {}
        annotations = Annotations(load_aichallenger(paths, merge_restval, problems, names))
        annotations.dataset_ids = names
        return annotations
