"""Caption text files of numbered lines, ``<image>#[<tag>#]<n><TAB or space><caption>``, with split lists.

Two formats read them:

* ``flickr8k``: Flickr8k's ``Flickr8k.token.txt`` (``1000268201_693b08cb0e.jpg#0<TAB>A child ...``)
  and Flickr8k-CN's caption files (``1000268201_693b08cb0e#zhc#0 一个孩子...``; ``zhc``: written in
  Chinese, ``zhm``/``zhb``: machine translations). Splits come from Flickr8k's lists
  ``Flickr_8k.trainImages.txt``, ``Flickr_8k.devImages.txt`` and ``Flickr_8k.testImages.txt`` in the
  caption file's folder or its parent; images lie in ``Flicker8k_Dataset/`` (the download's
  spelling) or ``Flickr8k_Dataset/`` there, else beside the file.
* ``coco_cn``: COCO-CN's ``imageid.human-written-caption.txt`` (and its translated and
  machine-translated files): ``COCO_val2014_000000000042#0<TAB>...``, split by
  ``coco-cn_train.txt``, ``coco-cn_val.txt`` and ``coco-cn_test.txt`` beside it; the images are
  COCO's (``val2014/COCO_val2014_000000000042.jpg`` under the images folder, ``--data.images_root``),
  and the image id is the COCO id (42), as COCO's results files name it.

A file that is not UTF-8 text, a line without the ``#<n>`` form, a missing split list or an image
in none of them is one line naming the file (and line).
"""

from __future__ import annotations

import os
import re

from captioning.data.formats.base import FORMATS, ID_RANGE, AnnotationFormat, check_text, image_path
from captioning.data.records import ImageRecord
from captioning.errors import AnnotationError
from captioning.files import require_file
from captioning.tokenizers import tokenize

_LINE = re.compile(r"^(?P<image>[^\s#]+)#(?:(?P<tag>[A-Za-z]\w*)#)?(?P<n>[0-9]+)\s+(?P<caption>.*)$")
# ASCII digits only: Python's \d takes any script's digits, and int() reads Arabic-Indic "٤٢" as 42
_COCO_NAME = re.compile(r"^COCO_(?P<folder>[a-z]+[0-9]{4})_(?P<id>[0-9]+)$")
FLICKR8K_LISTS = {
    "train": "Flickr_8k.trainImages.txt",
    "val": "Flickr_8k.devImages.txt",
    "test": "Flickr_8k.testImages.txt",
}
COCO_CN_LISTS = {"train": "coco-cn_train.txt", "val": "coco-cn_val.txt", "test": "coco-cn_test.txt"}
FLICKR8K_IMAGES = ("Flicker8k_Dataset", "Flickr8k_Dataset")


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 text file (a BOM allowed); one line of AnnotationError otherwise."""
    require_file(path, AnnotationError, "a caption file")
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read().splitlines()
    except UnicodeDecodeError as err:
        raise AnnotationError(
            f"{path}: not UTF-8 text (byte {err.start}); convert it, e.g. iconv -f GB18030 -t UTF-8"
        ) from None
    except OSError as err:
        raise AnnotationError(f"{path}: cannot read ({err.strerror or err})") from None


def parse_lines(path: str, problems: list | None) -> dict[str, list[str]]:
    """image name (as written before '#') -> its captions, in file order."""
    captions: dict[str, list[str]] = {}
    for number, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        match = _LINE.match(line.strip())
        if match is None:
            message = f"{path}: line {number}: expected '<image>#<n> <caption>' (or '<image>#zhc#<n> <caption>')"
            if problems is None:
                raise AnnotationError(message)
            problems.append(message)
            continue
        caption = " ".join(match.group("caption").split())
        check_text(caption, f"{path}: line {number}")
        if tokenize(caption):
            captions.setdefault(match.group("image"), []).append(caption)
    if not captions:
        raise AnnotationError(f"{path}: no captions (expected lines '<image>#<n> <caption>')")
    return captions


def read_splits(path: str, lists: dict[str, str], folders: list[str]) -> dict[str, str]:
    """image name (without extension) -> split, from the split lists found in ``folders``."""
    splits: dict[str, str] = {}
    for split, name in lists.items():
        found = next((os.path.join(d, name) for d in folders if os.path.isfile(os.path.join(d, name))), None)
        if found is None:
            raise AnnotationError(
                f"{path}: no split list {name} in {' or '.join(folders)} (the dataset's {', '.join(lists.values())})"
            )
        for line in read_lines(found):
            if line.strip():
                splits[_stem(line.strip())] = split
    return splits


def _stem(name: str) -> str:
    return name[:-4] if name.lower().endswith((".jpg", ".png")) else name


def _folders(path: str) -> list[str]:
    here = os.path.dirname(os.path.abspath(path))
    return [here, os.path.dirname(here)]


def load_flickr8k(path: str, problems: list | None = None) -> list[ImageRecord]:
    captions = parse_lines(path, problems)
    splits = read_splits(path, FLICKR8K_LISTS, _folders(path))
    records = []
    for name, caps in captions.items():
        split = splits.get(_stem(name))
        if split is None:
            message = f"{path}: image {name!r} is in none of the split lists ({', '.join(FLICKR8K_LISTS.values())})"
            if problems is None:
                raise AnnotationError(message)
            problems.append(message)
            continue
        file = name if name.lower().endswith((".jpg", ".png")) else name + ".jpg"
        rel = image_path(path, f"image {name!r}", file)
        records.append(ImageRecord(len(records), len(records), rel, split, caps, [tokenize(c) for c in caps]))
    return records


def load_coco_cn(path: str, problems: list | None = None) -> list[ImageRecord]:
    captions = parse_lines(path, problems)
    splits = read_splits(path, COCO_CN_LISTS, _folders(path)[:1])
    records = []
    seen: dict[int, str] = {}  # image id -> the name that gave it
    for name, caps in sorted(captions.items()):
        match = _COCO_NAME.match(_stem(name))
        split = splits.get(_stem(name))
        message, image_id = None, None
        if match is None:
            message = f"{path}: image {name!r:.80} is not a COCO image name (COCO_<folder>_<12 digits>)"
        elif len(digits := match.group("id").lstrip("0") or "0") > 19 or int(digits) > ID_RANGE[1]:
            message = f"{path}: image {name!r:.80}: its id is outside the 64-bit integers an image id may be"
        elif split is None:
            message = f"{path}: image {name!r} is in none of the split lists ({', '.join(COCO_CN_LISTS.values())})"
        else:
            image_id = int(digits)
            if image_id in seen:
                message = (
                    f"{path}: image {name!r} has the id {image_id} of image {seen[image_id]!r} (one image, two names)"
                )
        if message is not None:
            if problems is None:
                raise AnnotationError(message)
            problems.append(message)
            continue
        seen[image_id] = name
        rel = image_path(path, f"image {name!r}", match.group("folder"), _stem(name) + ".jpg")
        records.append(ImageRecord(len(records), image_id, rel, split, caps, [tokenize(c) for c in caps]))
    return records


def _first_line(path: str) -> re.Match | None:
    if not (os.path.isfile(path) and path.lower().endswith(".txt")):
        return None
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            for line in f:
                if line.strip():
                    return _LINE.match(line.strip())
    except OSError:
        return None
    return None


@FORMATS.register("flickr8k")
class Flickr8kFormat(AnnotationFormat):
    """Flickr8k's and Flickr8k-CN's caption text files (``<image>#[zhc#]<n> <caption>``), with Flickr8k's split lists."""

    description = "Flickr8k / Flickr8k-CN caption text files"
    priority = 36

    def detect(self, path: str) -> bool:
        match = _first_line(path)
        return match is not None and not _COCO_NAME.match(_stem(match.group("image")))

    def load(self, paths, split_file, merge_restval, problems):
        return load_flickr8k(paths[0], problems)

    def default_images_root(self, path: str) -> str:
        for folder in _folders(path):
            for name in FLICKR8K_IMAGES:
                if os.path.isdir(os.path.join(folder, name)):
                    return os.path.join(folder, name)
        return super().default_images_root(path)


@FORMATS.register("coco_cn")
class CocoCnFormat(AnnotationFormat):
    """COCO-CN's caption text files (``COCO_val2014_<id>#<n><TAB><caption>``), with its split lists; COCO's images."""

    description = "COCO-CN caption text files"
    priority = 36

    def detect(self, path: str) -> bool:
        match = _first_line(path)
        return match is not None and _COCO_NAME.match(_stem(match.group("image"))) is not None

    def load(self, paths, split_file, merge_restval, problems):
        return load_coco_cn(paths[0], problems)
