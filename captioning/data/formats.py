"""One entry point for every annotation format: ``load_records(path)`` -> list[ImageRecord].

- Karpathy split JSON (top-level ``"images"``): karpathy.py
- raw COCO caption JSON (top-level ``"annotations"``), optionally with a Karpathy split file: coco.py
- a captions CSV (``image,caption[,split]``) or JSON-lines file: folder.py
- a Hub dataset ``hf://owner/name[@revision]`` or a ``save_to_disk`` folder (``datasets``): hub.py
- WebDataset shards (a ``.tar`` file, a brace pattern, a folder of ``.tar`` files): webdataset.py
Several COCO caption files may be given as a list (train2014 and val2014 for the Karpathy split), and
several shard files or patterns.
"""
from __future__ import annotations

import mmap
import os
import re
from typing import Optional, Sequence, Union

from captioning.data.karpathy import ImageRecord, load_karpathy
from captioning.errors import AnnotationError
from captioning.common import PathLike

_COCO_KEY = re.compile(rb'"annotations"\s*:')


def default_images_root(annotations: Union[PathLike, Sequence[PathLike]]) -> str:
    """Where image paths are relative to unless told: the (first) annotation file's folder."""
    first = annotations if isinstance(annotations, (str, os.PathLike)) else (list(annotations) or [""])[0]
    from captioning.data.hub import hub_images_root, is_hub_dataset
    from captioning.data.webdataset import is_shards

    if is_shards(first):  # images are read from the shards; paths are only for messages
        first = os.fspath(first)
        return first if os.path.isdir(first) else os.path.dirname(os.path.abspath(first))
    if is_hub_dataset(first):
        return hub_images_root(os.fspath(first))
    return os.path.dirname(os.path.abspath(os.fspath(first)))


def detect_format(path: PathLike) -> str:
    """"karpathy", "coco", "folder", "hub" or "webdataset", from the suffix and (for JSON) a scan for an
    "annotations" key."""
    from captioning.data.hub import is_hub_dataset
    from captioning.data.webdataset import is_shards

    path = os.fspath(path)
    if is_hub_dataset(path):
        return "hub"
    if is_shards(path):
        return "webdataset"
    if path.lower().endswith((".csv", ".jsonl")):
        return "folder"
    if not os.path.isfile(path):
        raise AnnotationError(f"{path}: no such file")
    if os.path.getsize(path) == 0:
        raise AnnotationError(f"{path}: empty file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return "coco" if _COCO_KEY.search(m) else "karpathy"  # no parse: the reader parses once


def load_records(path: Union[PathLike, Sequence[PathLike]], split_file: Optional[PathLike] = None,
                 merge_restval: bool = True, problems: Optional[list] = None) -> list[ImageRecord]:
    """The ImageRecords of an annotation file in any supported format (see the module docstring).

    ``problems``: collect the problems of single images (Karpathy and COCO files) or rows (CSV / JSON lines)
    in this list and leave those out, instead of stopping at the first (``captioning prepare``)."""
    paths = [os.fspath(path)] if isinstance(path, (str, os.PathLike)) else [os.fspath(p) for p in path]
    if not paths:
        raise AnnotationError("no annotation file given")
    kinds = {p: detect_format(p) for p in paths}
    if len(paths) > 1 and set(kinds.values()) not in ({"coco"}, {"webdataset"}):
        raise AnnotationError(f"several annotation files are only supported for COCO caption files or shards, got {kinds}")
    kind = kinds[paths[0]]
    if kind == "webdataset":
        from captioning.data.webdataset import read_index

        if split_file:
            raise AnnotationError(f"{paths[0]}: a split file only applies to COCO caption files (these are shards)")
        return read_index(paths, merge_restval, problems).records
    if kind == "hub":
        from captioning.data.hub import load_hub

        if split_file:
            raise AnnotationError(f"{paths[0]}: a split file only applies to COCO caption files (this is a Hub dataset)")
        return load_hub(paths[0], merge_restval, problems)
    if kind == "coco":
        from captioning.data.coco import load_coco

        return load_coco(paths, split_file, merge_restval, problems=problems)
    if split_file:
        raise AnnotationError(f"{paths[0]}: a split file only applies to COCO caption files (this is {kind} format)")
    if kind == "folder":
        from captioning.data.folder import load_folder

        return load_folder(paths[0], merge_restval, problems)
    return load_karpathy(paths[0], merge_restval=merge_restval, problems=problems)
