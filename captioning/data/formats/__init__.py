"""One entry point for every annotation format: ``load_records(path)`` -> list[ImageRecord].

The formats are the classes registered in :data:`FORMATS` (data/formats/base.py); this module
imports the built-in ones, asked in this order (their ``priority``):

- ``hub``: a Hub dataset ``hf://owner/name[@revision]`` or a ``save_to_disk`` folder: hub.py
- ``webdataset``: shards (a ``.tar`` file, a brace pattern, a folder of ``.tar`` files): webdataset.py
- ``folder``: a captions CSV (``image,caption[,split]``) or JSON-lines file: folder.py
- ``aichallenger``: AI Challenger 2017's caption JSON lists: aichallenger.py
- ``flickr8k`` / ``coco_cn``: numbered caption lines (Flickr8k, Flickr8k-CN, COCO-CN) with split lists: flickr8k_coco_cn.py
- ``coco``: raw COCO caption JSON (top-level ``"annotations"``), optionally with a Karpathy split file: coco.py
- ``karpathy``: a Karpathy split JSON (top-level ``"images"``), any other file: karpathy.py

Several COCO caption files may be given as a list (train2014 and val2014 for the Karpathy split), and
several shard files or patterns: a format says so with ``several``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from captioning.common import PathLike
from captioning.data.formats import aichallenger, coco, flickr8k_coco_cn, folder, hub, karpathy, webdataset  # noqa: F401  (they register their formats)
from captioning.data.formats.base import FORMATS, AnnotationFormat, Annotations
from captioning.data.records import ImageRecord
from captioning.errors import AnnotationError

__all__ = ["FORMATS", "detect_format", "default_images_root", "list_formats", "load_records", "read_annotations"]


def list_formats() -> list[str]:
    """The registered formats' names, in the order :func:`detect_format` asks them."""
    return sorted(FORMATS.names(), key=lambda name: FORMATS.get(name).priority)


def _detect(path: str) -> str | None:
    return next((name for name in list_formats() if FORMATS.get(name)().detect(path)), None)


def detect_format(path: PathLike) -> str:
    """The name of the first format (in :func:`list_formats`' order) whose ``detect`` accepts ``path``."""
    path = os.fspath(path)
    name = _detect(path)
    if name is not None:
        return name
    if not os.path.isfile(path):
        raise AnnotationError(f"{path}: no such file")
    if os.path.getsize(path) == 0:
        raise AnnotationError(f"{path}: empty file")
    raise AnnotationError(f"{path}: not an annotation file of a known format ({', '.join(list_formats())})")


def _paths(annotations: PathLike | Sequence[PathLike]) -> list[str]:
    if isinstance(annotations, (str, os.PathLike)):
        return [os.fspath(annotations)]
    return [os.fspath(p) for p in annotations]


def default_images_root(annotations: PathLike | Sequence[PathLike]) -> str:
    """Where image paths are relative to unless told: the (first) path's format decides (the annotation
    file's folder unless the format says otherwise; also for a path no format accepts, whose reading
    then fails in one line)."""
    first = (_paths(annotations) or [""])[0]
    name = _detect(first)
    return (FORMATS.get(name)() if name else AnnotationFormat()).default_images_root(first)


def read_annotations(
    annotations: PathLike | Sequence[PathLike],
    split_file: PathLike | None = None,
    merge_restval: bool = True,
    problems: list | None = None,
    format: str | None = None,
) -> Annotations:
    """The records of an annotation source in any registered format, and where their images come from.

    ``format``: a registered format's name, else each path's format is detected. ``problems``:
    collect the problems of single images or rows in this list and leave those out, instead of
    stopping at the first (``captioning prepare``)."""
    paths = _paths(annotations)
    if not paths:
        raise AnnotationError("no annotation file given")
    kinds = {p: FORMATS.check(format) if format is not None else detect_format(p) for p in paths}
    kind = kinds[paths[0]]
    fmt = FORMATS.get(kind)()
    if len(paths) > 1 and (len(set(kinds.values())) > 1 or not fmt.several):
        several = " or ".join(FORMATS.get(n).description for n in list_formats() if FORMATS.get(n).several)
        raise AnnotationError(f"several annotation files are only supported for {several}, got {kinds}")
    if split_file and not fmt.takes_split_file:
        takes = " or ".join(FORMATS.get(n).description for n in list_formats() if FORMATS.get(n).takes_split_file)
        raise AnnotationError(f"{paths[0]}: a split file only applies to {takes}, not to {fmt.description}")
    return fmt.read(paths, os.fspath(split_file) if split_file else None, merge_restval, problems)


def load_records(
    path: PathLike | Sequence[PathLike],
    split_file: PathLike | None = None,
    merge_restval: bool = True,
    problems: list | None = None,
    format: str | None = None,
) -> list[ImageRecord]:
    """The ImageRecords of an annotation source in any registered format (see :func:`read_annotations`)."""
    return read_annotations(path, split_file, merge_restval, problems, format).records
