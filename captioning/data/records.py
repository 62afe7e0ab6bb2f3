"""What every annotation format reads to: one :class:`ImageRecord` per image, and the splits; and the
records as arrays (:class:`ImageRefs`, :class:`CaptionTable`), what the datasets and their loader
workers read."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from captioning.errors import ConfigError

SPLITS = ("train", "val", "test", "restval", "test_novel")  # test_novel: data/shapes/holdout.py


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
        self.tokens = intern_tokens(self.tokens)


def intern_tokens(tokens: list[list[str]]) -> list[list[str]]:
    """Each caption's tokens as the interned strings (anything else in them kept as it is)."""
    try:
        return [list(map(sys.intern, words)) for words in tokens]
    except TypeError:  # a token that is no exact string
        return [[sys.intern(t) if type(t) is str else t for t in words] for words in tokens]


def split_records(records: Sequence[ImageRecord], split: str) -> list[ImageRecord]:
    """The records of one split (``train`` includes restval once merged)."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    return [r for r in records if r.split == split]


# --------------------------------------------------------------------------- the records as arrays
#
# A loader worker is a fork of the training process: it shares the parent's memory until a page is
# written. Reading a Python object writes its reference count, so a worker that reads records
# (lists of lists of strings) copies, page by page, every record it reads: at COCO's size, over an
# epoch, all of them, in every worker. The datasets read these arrays instead: numpy buffers whose
# pages reading leaves shared (docs/PERFORMANCE.md, COCO-sized data).


class StringArray:
    """Strings as one UTF-8 buffer and their offsets: ``array[i]`` is the i-th string (any ``str``,
    lone surrogates included, comes back equal)."""

    def __init__(self, strings: Sequence[str]):
        encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=self.offsets[1:])
        self.buffer = np.frombuffer(b"".join(encoded), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        start, end = self.offsets[i], self.offsets[i + 1]
        return self.buffer[start:end].tobytes().decode("utf-8", "surrogatepass")


class ImageRef(NamedTuple):
    """What reading one record's image needs (a dataset's :meth:`visual` takes it as a record)."""

    imgid: int
    image_id: int
    path: str


class ImageRefs:
    """The records' ``imgid``, ``image_id`` and ``path`` as arrays; ``refs[i]`` is the i-th record's
    :class:`ImageRef`."""

    def __init__(self, records: Sequence[ImageRecord]):
        self.imgid = np.fromiter((r.imgid for r in records), dtype=np.int64, count=len(records))
        self.image_id = np.fromiter((r.image_id for r in records), dtype=np.int64, count=len(records))
        self.paths = StringArray([r.path for r in records])

    def __len__(self) -> int:
        return len(self.imgid)

    def __getitem__(self, i: int) -> ImageRef:
        return ImageRef(int(self.imgid[i]), int(self.image_id[i]), self.paths[i])


class CaptionTable:
    """Every caption of some records as token ids, built in one pass over their tokens: the
    vocabulary's counts (:meth:`counts`), the (image, caption) pairs (:meth:`record_of_caption`),
    their lengths (:meth:`lengths`) and their encoding (:meth:`encode`) are array operations on it.

    Attributes:
        words: the distinct tokens, in the order first seen.
        tokens: (tokens,) int32: every caption's tokens as indices into ``words``, caption after caption.
        starts: (captions + 1,) int64: where each caption's tokens start in ``tokens``.
        first_caption: (records + 1,) int64: each record's first caption (its captions are
            ``first_caption[r]`` to ``first_caption[r + 1]``, in the record's order).
    """

    def __init__(self, words: list[str], tokens: np.ndarray, starts: np.ndarray, first_caption: np.ndarray):
        self.words, self.tokens, self.starts, self.first_caption = words, tokens, starts, first_caption

    @classmethod
    def of(cls, records: Sequence[ImageRecord]) -> CaptionTable:
        """The table of the records' ``tokens``, in the records' order."""
        index: dict[str, int] = {}
        flat: list[int] = []
        lengths: list[int] = []
        counts = np.fromiter((len(r.tokens) for r in records), dtype=np.int64, count=len(records))
        for r in records:
            for words in r.tokens:
                lengths.append(len(words))
                try:
                    flat.extend([index[w] for w in words])
                except KeyError:
                    flat.extend([index.setdefault(w, len(index)) for w in words])
        starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        first = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum(counts, out=first[1:])
        return cls(list(index), np.array(flat, dtype=np.int32), starts, first)

    @property
    def num_captions(self) -> int:
        return len(self.starts) - 1

    def __len__(self) -> int:
        """The records."""
        return len(self.first_caption) - 1

    def counts(self) -> dict[str, int]:
        """How often each word occurs: word -> count (what the vocabulary is built from)."""
        return dict(zip(self.words, np.bincount(self.tokens, minlength=len(self.words)).tolist()))

    def lengths(self) -> np.ndarray:
        """(captions,) int64: the tokens of each caption."""
        return np.diff(self.starts)

    def record_of_caption(self) -> np.ndarray:
        """(captions,) int64: the record of each caption."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.first_caption))

    def encode(self, stoi: dict[str, int], unknown: int) -> np.ndarray:
        """(tokens,) int32: ``tokens`` as the ids ``stoi`` gives their words (``unknown`` for a word it
        lacks)."""
        lookup = np.fromiter((stoi.get(w, unknown) for w in self.words), dtype=np.int32, count=len(self.words))
        return lookup[self.tokens] if len(self.tokens) else np.zeros(0, dtype=np.int32)
