"""Caption datasets of the Hugging Face ``datasets`` library -> ImageRecords.

An annotation "path" is a Hub dataset when it is

- ``hf://owner/name[@revision]``: loaded with ``datasets.load_dataset`` through the library's
  cache (offline and not cached: one line naming the dataset), or
- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``.

The layout is recognised by the columns (yerevann/coco-karpathy, nlphuji/flickr30k, jxie/flickr8k).
Either path may end in ``?column=...&...``, a column mapping for any other layout: ``image`` or
``path``, ``captions``, ``split`` and ``id``, e.g. ``hf://me/pets?image=photo&captions=text_a,text_b&split=fold``.
Splits come from the split column where there is one, else from the Hub split. Images held in the
dataset are written once under ``$CAPTIONING_IMAGE_CACHE`` (default ``~/.cache/captioning/dataset-images``)
and read from there by the one image route, so that every later check (prepare, the loaders) is that
of image files. Image URLs are never fetched.

The layouts' columns, the column mapping, splits and images: docs/DATA_ECOSYSTEM.md, "Hub datasets".
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from captioning.data.formats.base import FORMATS, AnnotationFormat, check_id, check_text, is_int, shown
from captioning.data.records import ImageRecord
from captioning.errors import AnnotationError
from captioning.tokenizers import tokenize

HUB_PREFIX = "hf://"
#: Hub split names -> Karpathy split names
SPLIT_NAMES = {
    "train": "train",
    "validation": "val",
    "valid": "val",
    "val": "val",
    "dev": "val",
    "test": "test",
    "restval": "restval",
}
#: the image formats written to the cache (data/images.py's IMAGE_FORMATS) and their file suffixes
SUFFIXES = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp", "BMP": ".bmp", "GIF": ".gif", "TIFF": ".tif"}


def split_query(path: str) -> tuple[str, dict]:
    """("hf://o/n@rev" or a folder, {column mapping}) of an annotation path ending in ``?key=value&...``."""
    base, sep, query = path.partition("?")
    if not sep:
        return path, {}
    return base, dict(parse_qsl(query, keep_blank_values=True))


def is_hub_dataset(path: Any) -> bool:
    """Whether an annotation path names a Hub dataset or a ``save_to_disk`` folder."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    base, _ = split_query(os.fspath(path))
    if base.startswith(HUB_PREFIX):
        return True
    return os.path.isdir(base) and any(
        os.path.isfile(os.path.join(base, f)) for f in ("dataset_dict.json", "state.json")
    )


@dataclass
class Columns:
    """Where a layout keeps each part of a record (column names)."""

    captions: tuple[str, ...]
    image: str | None = None
    path: tuple[str, ...] = ()
    split: str | None = None
    id: str | None = None
    layout: str = "column mapping"


MAPPING_KEYS = ("image", "path", "captions", "split", "id")


def columns_of(names: list[str], mapping: dict, where: str) -> Columns:
    """The layout of a dataset with columns ``names``: the mapping given, or one recognised."""
    if mapping:
        unknown = sorted(set(mapping) - set(MAPPING_KEYS))
        if unknown:
            raise AnnotationError(
                f"{where}: unknown column mapping key(s) {', '.join(unknown)} (expected {', '.join(MAPPING_KEYS)})"
            )
        split = lambda key: tuple(c for c in mapping.get(key, "").split(",") if c)  # noqa: E731
        cols = Columns(
            split("captions"),
            mapping.get("image") or None,
            split("path"),
            mapping.get("split") or None,
            mapping.get("id") or None,
        )
        if not cols.captions or bool(cols.image) == bool(cols.path):
            raise AnnotationError(f"{where}: the column mapping needs captions= and one of image= or path=")
        missing = [c for c in (*cols.captions, cols.image, *cols.path, cols.split, cols.id) if c and c not in names]
        if missing:
            raise AnnotationError(f"{where}: no column(s) {', '.join(missing)} (the columns: {', '.join(names)})")
        return cols
    has = set(names).__contains__
    numbered = sorted((c for c in names if re.fullmatch(r"caption_\d+", c)), key=lambda c: int(c.split("_")[1]))
    if has("sentences") and has("filename"):
        return Columns(
            ("sentences",),
            path=tuple(c for c in ("filepath", "filename") if has(c)),
            split="split" if has("split") else None,
            id=next((c for c in ("cocoid", "imgid") if has(c)), None),
            layout="coco-karpathy",
        )
    if has("image") and has("caption"):
        return Columns(
            ("caption",),
            image="image",
            split="split" if has("split") else None,
            id=next((c for c in ("img_id", "image_id", "id") if has(c)), None),
            layout="flickr30k",
        )
    if has("image") and numbered:
        return Columns(
            tuple(numbered),
            image="image",
            split="split" if has("split") else None,
            id=next((c for c in ("img_id", "image_id", "id") if has(c)), None),
            layout="flickr8k",
        )
    raise AnnotationError(
        f"{where}: unknown dataset layout (columns: {', '.join(names)}); name the columns after the path, "
        f"e.g. {where}?image=COLUMN&captions=COLUMN[,COLUMN...]&split=COLUMN (or path=COLUMN for image files)"
    )


#: a Hub dataset name: ``owner/name`` or a canonical ``name``; each part begins with a letter or
#: digit (never ``.`` or ``..``), as the Hub's repository names do
HUB_NAME = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")
#: the first ``datasets`` release that takes ``trust_remote_code`` (before it, a dataset's loading
#: script always ran); from 2.16 to 2.19 the script runs unless told False, which open_dataset does
FIRST_SAFE_DATASETS = (2, 16)


def hub_name(path: str) -> tuple[str, str | None]:
    """(name, revision or None) of ``hf://owner/name[@revision]``, checked: a Hub name only, never a
    path on this machine (``datasets.load_dataset`` reads a local folder or script of that name
    first, so a name that exists here is refused rather than read); one-line AnnotationError."""
    name, _, revision = path[len(HUB_PREFIX) :].partition("@")
    if not HUB_NAME.fullmatch(name) or ".." in name or name.endswith((".", "-")):
        raise AnnotationError(f"{path}: expected hf://owner/name[@revision], a Hub dataset's name")
    if os.path.lexists(name):
        raise AnnotationError(
            f"{path}: {name!r} is also a path in the working folder, which the datasets library would read "
            f"instead of the Hub dataset; run from another folder, or give a save_to_disk folder as a path"
        )
    return name, revision or None


def _check_datasets_version(datasets, path: str) -> None:
    """One line if the installed ``datasets`` would run a Hub dataset's loading script whatever it is told."""
    version = tuple(int(x) for x in re.findall(r"\d+", datasets.__version__)[:2])
    if version < FIRST_SAFE_DATASETS:
        raise AnnotationError(
            f"{path}: datasets {datasets.__version__} runs a Hub dataset's loading script (code) when it loads it; "
            "upgrade it (pip install 'datasets>=2.20') to read Hub datasets"
        )


def open_dataset(path: str) -> dict:
    """{Hub split name: datasets.Dataset} of ``hf://owner/name[@revision]`` or a save_to_disk folder.

    A Hub dataset is loaded with ``trust_remote_code=False``: a dataset that needs its loading script
    run is refused by the library, never run."""
    try:
        import datasets
    except ImportError:
        raise AnnotationError(
            f"{path}: reading Hub datasets needs the datasets package (pip install -e '.[ecosystem]')"
        ) from None
    if path.startswith(HUB_PREFIX):
        name, revision = hub_name(path)
        _check_datasets_version(datasets, path)
        try:
            loaded = datasets.load_dataset(name, revision=revision, trust_remote_code=False)
        except Exception as err:  # offline, not cached, no such dataset, gated, a loading script refused...
            detail = " ".join(str(err).split())[:160] or type(err).__name__
            raise AnnotationError(
                f"{path}: could not load the dataset {name} ({type(err).__name__}: {detail}); load it once with network "
                f"access (it stays in the datasets cache), or pass a folder written by save_to_disk"
            ) from None
    else:
        try:
            loaded = datasets.load_from_disk(path)
        except Exception as err:
            raise AnnotationError(
                f"{path}: not a readable save_to_disk folder ({type(err).__name__}: {str(err)[:160]})"
            ) from None
    if isinstance(loaded, datasets.Dataset):
        return {"": loaded}
    return dict(loaded)


def _cache_root() -> str:
    return os.environ.get("CAPTIONING_IMAGE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "captioning", "dataset-images"
    )


def _local_image(source: Any, local_root: str | None) -> bytes:
    """The bytes of an image value that holds a file path instead of bytes: only for a save_to_disk
    folder (``local_root``), and only a file inside that folder (a relative path is relative to it).
    A dataset from the Hub never makes this machine read one of its own files."""
    if local_root is None:
        raise AnnotationError(
            f"holds a file path ({shown(source)}), not image bytes: a Hub dataset's images are "
            "read from the bytes it holds, never from this machine's disk"
        )
    if not isinstance(source, str) or not source:
        raise AnnotationError("no image bytes")
    root = os.path.realpath(local_root)
    file = os.path.realpath(os.path.join(root, source))
    if os.path.commonpath([root, file]) != root:
        raise AnnotationError(
            f"image path {shown(source)} is outside the dataset's folder {local_root} (only files inside it are read)"
        )
    try:
        with open(file, "rb") as f:
            return f.read()
    except OSError as err:
        raise AnnotationError(f"image path {shown(source)}: cannot read ({err.strerror or err})") from None


def _image_file(value: Any, folder: str, stem: str, local_root: str | None = None) -> str:
    """The cached file of one image value of the dataset (written once); AnnotationError if it is not
    an image of an accepted format. A value of a file path and no bytes is read only from inside a
    save_to_disk folder ``local_root`` (:func:`_local_image`)."""
    from PIL import Image, UnidentifiedImageError

    from captioning.data.images import IMAGE_FORMATS

    data = value.get("bytes") if isinstance(value, dict) else value
    source = value.get("path") if isinstance(value, dict) else None
    if data is None and source:
        data = _local_image(source, local_root)
    if isinstance(data, Image.Image):  # a decoded image: stored as PNG
        buffer = io.BytesIO()
        data.save(buffer, format="PNG")
        data = buffer.getvalue()
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise AnnotationError("no image bytes")
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
            kind = img.format
    except (UnidentifiedImageError, OSError, ValueError):
        raise AnnotationError(f"not an image of an accepted format ({', '.join(IMAGE_FORMATS)})") from None
    file = os.path.join(folder, stem + SUFFIXES.get(kind, ".img"))
    if not (os.path.isfile(file) and os.path.getsize(file) == len(data)):
        from captioning.files import atomic_write_bytes

        os.makedirs(folder, exist_ok=True)
        atomic_write_bytes(file, bytes(data))
    return file


def _captions(row: dict, cols: Columns) -> list[str]:
    out = []
    for c in cols.captions:
        value = row[c]
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, dict):  # Karpathy's {"raw": ..., "tokens": [...]}
                tokens = item.get("tokens") or []
                if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
                    raise AnnotationError(f"{c}: tokens: expected a list of strings, got {shown(tokens)}")
                item = item.get("raw") or " ".join(tokens)
            if item is not None and not isinstance(item, str):
                raise AnnotationError(f"{c}: expected strings, got {type(item).__name__}")
            if item is not None:
                check_text(item, c)
            if item and item.strip():
                out.append(item.strip())
    return out


def _image_id(value: Any, column: str) -> int | None:
    """The image id of an id column's value (an integer, or a string of ASCII digits), None for
    another value; one line for an id no 64-bit tensor holds."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        if len(value.strip()) > 40:  # past int64 whatever its leading zeros; int() of it may be refused by Python
            raise AnnotationError(f"{column}: {shown(value)} is outside the 64-bit integers an image id may be")
        value = int(value)
    return check_id(value, column) if is_int(value) else None


def load_hub(path: str, merge_restval: bool = True, problems: list | None = None) -> list[ImageRecord]:
    """The ImageRecords of a Hub dataset or save_to_disk folder (see the module docstring).

    A problem of one row (no captions, an unknown split, image bytes that are no accepted image, an
    id used twice) raises :class:`AnnotationError` naming the split and row, or with ``problems``
    is appended there and the row left out, so that one reading lists them all."""
    base, mapping = split_query(path)
    parts = open_dataset(base)
    local_root = None if base.startswith(HUB_PREFIX) else base  # a save_to_disk folder's own files may be read
    key = hashlib.sha1("|".join(f"{s}:{d._fingerprint}" for s, d in sorted(parts.items())).encode()).hexdigest()[:16]
    folder = os.path.join(_cache_root(), key)
    records: list[ImageRecord] = []
    seen: dict[int, str] = {}
    counter = 0
    for hub_split, dataset in parts.items():
        cols = columns_of(list(dataset.column_names), mapping, base)
        if cols.image:
            import datasets

            if isinstance(dataset.features.get(cols.image), datasets.Image):
                dataset = dataset.cast_column(cols.image, datasets.Image(decode=False))  # the stored bytes
        for i, row in enumerate(dataset):
            where = f"{base}: {hub_split + '[' if hub_split else 'row '}{i}{']' if hub_split else ''}"
            counter += 1
            try:
                raw_split = row[cols.split] if cols.split else hub_split
                split = SPLIT_NAMES.get(str(raw_split).lower()) if raw_split is not None else None
                if split is None:
                    raise AnnotationError(
                        f"unknown split {raw_split!r} (expected train, val/validation, test or restval)"
                    )
                captions = _captions(row, cols)
                if not captions:
                    raise AnnotationError("no usable captions (all missing or empty)")
                image_id = _image_id(row[cols.id], cols.id) if cols.id else None
                image_id = counter - 1 if image_id is None else image_id
                if image_id in seen:
                    raise AnnotationError(f"image id {image_id} already used by {seen[image_id]}")
                if cols.image:
                    try:
                        rel = _image_file(row[cols.image], os.path.join(folder, hub_split or "all"), str(i), local_root)
                    except AnnotationError as err:
                        raise AnnotationError(f"{cols.image}: {err}") from None
                else:
                    pieces = [str(row[c]) for c in cols.path if row[c]]
                    rel = os.path.normpath(os.path.join(*pieces)) if pieces else ""
                    if not pieces or os.path.isabs(rel) or rel.startswith(".."):
                        raise AnnotationError(f"image path {rel!r}: expected a path relative to --data.images_root")
            except AnnotationError as err:
                message = f"{where}: {err}"
                if problems is None:
                    raise AnnotationError(message) from None
                problems.append(message)
                continue
            seen[image_id] = where
            if merge_restval and split == "restval":
                split = "train"
            records.append(ImageRecord(counter - 1, image_id, rel, split, captions, [tokenize(c) for c in captions]))
    return records


def hub_images_root(path: str) -> str:
    """Where a Hub dataset's image paths are relative to unless told: for images held in the dataset
    any folder does (their paths are absolute); a dataset of image paths needs --data.images_root."""
    base, mapping = split_query(path)
    parts = open_dataset(base)
    first = next(iter(parts.values()))
    cols = columns_of(list(first.column_names), mapping, base)
    if cols.image:
        return _cache_root()
    urls = " (only their paths and URLs, never fetched)" if "url" in first.column_names else " (only their paths)"
    raise AnnotationError(
        f"{base}: the dataset holds no images{urls}: give the folder holding them with "
        f"--data.images_root PATH (--images-root for prepare and evaluate)"
    )


@FORMATS.register("hub")
class HubFormat(AnnotationFormat):
    """A Hub dataset ``hf://owner/name[@revision]`` or a ``save_to_disk`` folder (see the module docstring)."""

    description = "a Hub dataset"
    priority = 10

    def detect(self, path: str) -> bool:
        return is_hub_dataset(path)

    def load(self, paths, split_file, merge_restval, problems):
        return load_hub(paths[0], merge_restval, problems)

    def default_images_root(self, path: str) -> str:
        return hub_images_root(path)
