"""What every annotation format reads to: one :class:`ImageRecord` per image, and the splits."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from captioning.errors import ConfigError

SPLITS = ("train", "val", "test", "restval", "test_novel")  # test_novel: data/holdout.py


@dataclass(slots=True)
class ImageRecord:
    """One image and its reference captions; ``path`` is relative to the images root.

    Slotted, and its tokens interned (one string object per distinct word, shared by every
    caption): at COCO's size (616,767 captions) the records are the largest thing ``prepare`` and
    ``fit`` hold (docs/PERFORMANCE.md, COCO-sized data)."""

    imgid: int
    image_id: int  # cocoid if present, else imgid: the id used in results files and metrics
    path: str
    split: str
    captions: list[str]  # raw reference captions (empty ones dropped)
    tokens: list[list[str]]  # the captions' tokens (the data's tokenizer), parallel to captions
    objects: list[dict] = field(default_factory=list)
    width: int | None = None
    height: int | None = None

    def __post_init__(self):
        self.tokens = [[sys.intern(t) if type(t) is str else t for t in words] for words in self.tokens]


def split_records(records: Sequence[ImageRecord], split: str) -> list[ImageRecord]:
    """The records of one split (``train`` includes restval once merged)."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    return [r for r in records if r.split == split]
