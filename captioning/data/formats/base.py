"""The annotation-format extension point: the base class, its registry, and what every reader shares.

A format is one class registered in :data:`FORMATS` beside its reader (karpathy.py, coco.py,
folder.py, hub.py, webdataset.py)::

    @FORMATS.register("karpathy")
    class KarpathyFormat(AnnotationFormat):
        priority = 100  # the fallback: any other JSON file

        def detect(self, path): ...
        def load(self, paths, split_file, merge_restval, problems): ...

data/formats/__init__.py imports the built-in formats and answers from the registry (``detect_format``,
``read_annotations``, ``load_records``, ``default_images_root``); :class:`CaptionData` asks the
:class:`Annotations` it read where each image comes from. A user's format registers when the user
imports its module.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from captioning.data.records import ImageRecord
from captioning.errors import AnnotationError
from captioning.files import read_json_file, require_file
from captioning.registry import Registry

if TYPE_CHECKING:
    from PIL import Image
    from torch.utils.data import DataLoader

    from captioning.data.datasets import ImageDataset

FORMATS: Registry[type[AnnotationFormat]] = Registry("annotation format", field="format")


class Annotations:
    """What reading an annotation source gives: its records, and where their images come from.

    This base reads each record's image file under the images folder (``images_root`` /
    ``record.path``). A format whose images lie elsewhere (WebDataset shards) returns a subclass
    that overrides :meth:`image_bytes`, :meth:`read_image`, :meth:`image_dataset` and
    :meth:`train_loader`.
    """

    #: the dataset's own id of each record's ``image_id`` where the format names its images otherwise
    #: (AI Challenger: the file name, "<40 hex>.jpg"), for results files; None: the image_ids are the dataset's
    dataset_ids: dict[int, str] | None = None

    def __init__(self, records: list[ImageRecord]):
        self.records = records

    def image_bytes(self, record: ImageRecord, images_root: str) -> bytes:
        """The record's image as stored (its file's bytes)."""
        with open(os.path.join(images_root, record.path), "rb") as f:
            return f.read()

    def read_image(self, record: ImageRecord, images_root: str) -> Image.Image:
        """The record's image as an RGB PIL image, not resized, by data/images.py's rules."""
        from captioning.data.images import load_image

        return load_image(os.path.join(images_root, record.path))

    def image_dataset(
        self,
        records: Sequence[ImageRecord],
        images_root: str,
        image_size: int,
        features=None,
        cache_images: bool = False,
        interpolation: str = "bilinear",
    ) -> ImageDataset:
        """One sample per record, ``{"images": (3, S, S), "image_ids": int}`` (or its cached features
        (L, D)): evaluation and feature extraction."""
        from captioning.data.datasets import ImageDataset

        return ImageDataset(
            records, images_root, image_size, features=features, cache_images=cache_images, interpolation=interpolation
        )

    def train_loader(self, data) -> DataLoader | None:
        """The training loader of ``data`` (a :class:`~captioning.data.captions.CaptionData`) when
        the format streams its own, else None: CaptionData's loader of (image file, caption) pairs."""
        return None


class AnnotationFormat:
    """One kind of annotation source: how to tell it from a path, read it, and where its images lie.

    Attributes:
        description: what it is, in messages ("COCO caption files").
        priority: :func:`~captioning.data.formats.detect_format` asks the formats in increasing
            priority (ties: registration order), so that one whose test is a suffix or a folder's
            contents answers before one that reads the file, and a fallback goes last.
        several: whether several paths may be read together (COCO's train2014 + val2014, shard lists).
        takes_split_file: whether a split file (``--data.split_file``) assigns its splits.
    """

    description: str = "an annotation file"
    priority: int = 50
    several: bool = False
    takes_split_file: bool = False

    def detect(self, path: str) -> bool:
        """Whether ``path`` is of this format (cheap: a suffix, a folder's files, a scan; no parse)."""
        raise NotImplementedError

    def load(
        self, paths: list[str], split_file: str | None, merge_restval: bool, problems: list[str] | None
    ) -> list[ImageRecord]:
        """The records of ``paths`` (one path unless ``several``), ``restval`` merged into ``train``
        if ``merge_restval``. A problem of one image or row raises a one-line
        :class:`AnnotationError`, or with a ``problems`` list is appended there and the image left
        out, so that one reading lists them all; a problem of the whole file still raises."""
        raise NotImplementedError

    def read(
        self,
        paths: list[str],
        split_file: str | None = None,
        merge_restval: bool = True,
        problems: list[str] | None = None,
    ) -> Annotations:
        """:meth:`load`'s records with their images' source (image files, by default)."""
        return Annotations(self.load(paths, split_file, merge_restval, problems))

    def default_images_root(self, path: str) -> str:
        """Where image paths are relative to unless told: the annotation file's folder."""
        return os.path.dirname(os.path.abspath(path))


# ------------------------------------------------------------------------ what every reader shares
def is_int(x: Any) -> bool:
    """An integer of JSON (True and False are not)."""
    return isinstance(x, int) and not isinstance(x, bool)


#: the integers an image id may be: those of a 64-bit tensor (the batches' ``image_ids``)
ID_RANGE = (-(2**63), 2**63 - 1)


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, for one-line messages about any value of a file."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_id(value: Any, where: str) -> int:
    """``value`` if it is an integer that a 64-bit tensor holds (a batch's ``image_ids``), else a
    one-line AnnotationError naming ``where`` (the file and field)."""
    if not is_int(value):
        raise AnnotationError(f"{where}: expected an integer, got {shown(value)}")
    if not ID_RANGE[0] <= value <= ID_RANGE[1]:
        raise AnnotationError(
            f"{where}: {shown(value)} is outside the 64-bit integers an image id may be "
            f"({ID_RANGE[0]} to {ID_RANGE[1]})"
        )
    return value


def check_text(value: str, where: str) -> str:
    """``value`` if UTF-8 can store it (JSON's ``\\ud800`` escapes give lone surrogates, which no
    file the project writes can hold), else a one-line AnnotationError naming ``where``."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise AnnotationError(
            f"{where}: a lone surrogate {shown(value[err.start : err.end])} is no text UTF-8 "
            "can store (a broken \\ud800-style escape?)"
        ) from None
    return value


def check_texts(values: Sequence[str], where: str) -> None:
    """:func:`check_text` of each string."""
    for value in values:
        check_text(value, where)


def check_objects(objects: Any, where: str) -> list[dict]:
    """An image's ``objects`` (the shapes data's: each a ``words`` list of strings, or ``size``,
    ``color`` and ``shape`` strings, and optionally a ``bbox`` [x0, y0, x1, y1] of finite numbers),
    checked at reading so that scoring (data/shapes/__init__.py) never meets one it cannot use; None is no objects."""
    objects = [] if objects is None else objects
    if not isinstance(objects, list):
        raise AnnotationError(f"{where}: expected a list of objects, got {type(objects).__name__}")
    for k, obj in enumerate(objects):
        at = f"{where}[{k}]"
        if not isinstance(obj, dict):
            raise AnnotationError(f"{at}: expected an object, got {type(obj).__name__}")
        words = obj.get("words")
        if words is not None:
            if not isinstance(words, list) or not words or not all(isinstance(w, str) for w in words):
                raise AnnotationError(f"{at}.words: expected a non-empty list of strings, got {shown(words)}")
            check_texts(words, f"{at}.words")
        else:
            for name in ("size", "color", "shape"):
                if not isinstance(obj.get(name), str):
                    raise AnnotationError(
                        f"{at}: expected 'words' or the strings 'size', 'color' and 'shape' "
                        f"({name}: {shown(obj.get(name))})"
                    )
                check_text(obj[name], f"{at}.{name}")
        bbox = obj.get("bbox")
        if bbox is not None and not (
            isinstance(bbox, list)
            and len(bbox) == 4
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in bbox)
        ):
            raise AnnotationError(f"{at}.bbox: expected [x0, y0, x1, y1], four finite numbers, got {shown(bbox)}")
    return objects


def check_image_size(width: Any, height: Any, where: str) -> tuple[int | None, int | None]:
    """An image's recorded ``width`` and ``height``: positive integers (None: not recorded) whose
    product the image decoder would accept (data/images.py's pixel limit), else a one-line AnnotationError."""
    for name, value in (("width", width), ("height", height)):
        if value is not None and (not is_int(value) or value < 1):
            raise AnnotationError(f"{where}.{name}: expected a positive integer, got {shown(value)}")
    if width is not None and height is not None:
        from PIL import Image

        limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        if limit and width * height > limit:
            raise AnnotationError(f"{where}: {width} x {height} pixels is over the image decoder's limit of {limit:,}")
    return width, height


def read_json(path: str) -> Any:
    """A JSON annotation file, with one-line AnnotationErrors for a missing, unreadable or malformed file
    (files.py: read_json_file, every JSON reader's)."""
    require_file(path, AnnotationError, "an annotation file")
    return read_json_file(path, AnnotationError, "a JSON annotation file")


def image_path(path: str, where: str, *parts: str) -> str:
    """A record's image path, relative to the images folder: normalised, and refused (one line naming
    ``where`` in the annotation file ``path``) when absolute or above the folder (``..``)."""
    rel = check_text(os.path.normpath(os.path.join(*parts)), f"{path}: {where}: image path")
    if os.path.isabs(rel) or os.path.splitdrive(rel)[0] or rel in (".", "..") or rel.startswith(".." + os.sep):
        raise AnnotationError(
            f"{path}: {where}: image path {rel!r} is outside the images folder (absolute, "
            "or '..' above it); give paths relative to --data.images_root"
        )
    return rel
