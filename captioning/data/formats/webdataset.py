"""WebDataset shards: ``.tar`` files of samples ``KEY.jpg|png|webp`` + ``KEY.txt`` (one caption) or
``KEY.json`` (captions and fields), as img2dataset writes them; read, streamed for training, and written.

An annotation "path" is shards when it is a ``.tar`` file, a brace pattern (``data/train-{000000..000031}.tar``),
a folder holding ``.tar`` files (all of them, sorted by name), or a list of these. Shards are local files (the
index records where each image lies in its shard). A sample is the files of one key (``KEY.EXT``, the key up to
the first dot of the name, as webdataset groups them). A sample's problem (no image or captions, an unknown
split, an id used twice) is that sample's, and ``captioning prepare`` lists them all.

- The index: one pass over the tar headers and text members gives the records and each image's place (shard,
  offset, size); images are skipped by seeking past them.
- :class:`ShardStream` (an IterableDataset) streams training: each pair read once per epoch, in a shuffle
  buffer, an image decoded when it leaves the buffer. :class:`ShardLoader` saves the epoch and the batches
  served, so that a resume is exact.
- :class:`ShardImageDataset` (map-style) reads evaluation's val/test images by their place.
- :func:`write_shards` (``captioning prepare --to-webdataset OUT``) writes any dataset as
  ``OUT/{split}-NNNNNN.tar`` with webdataset's ShardWriter, whole or not at all.

The samples' fields, the stream's order, resume and writing: docs/DATA_ECOSYSTEM.md, "WebDataset shards".
"""

from __future__ import annotations

import io
import json
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from captioning.data.datasets import Collate, ImageDataset
from captioning.data.formats.base import (
    FORMATS,
    AnnotationFormat,
    Annotations,
    check_id,
    check_image_size,
    check_objects,
    check_texts,
    is_int,
)
from captioning.data.records import ImageRecord
from captioning.data.tars import TAR_ERRORS, TEXT_EXTS, tar_members
from captioning.errors import AnnotationError, ConfigError, ImageError, ImageTooLargeError, NotAnImageError
from captioning.files import folder_writer, parse_json
from captioning.tokenizers import tokenize
from captioning.vocab import Vocabulary

#: image members read as a sample's image (file suffixes without the dot)
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
SPLIT_NAMES = {
    "train": "train",
    "val": "val",
    "validation": "val",
    "valid": "val",
    "dev": "val",
    "test": "test",
    "restval": "restval",
}
_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's key + extension of a member name
_BRACES = re.compile(r"\{[^{}]*\}")
#: a shard being written (write_shards), renamed to its .tar name once every shard is whole
_PARTIAL = re.compile(r"\w+-\d{6}\.tar\.partial")
#: the most shard files one brace pattern may name (counted before it is expanded)
MAX_PATTERN_SHARDS = 1_000_000


# ---------------------------------------------------------------------------------------- naming
def _is_shard_spec(item: str) -> bool:
    if item.lower().endswith(".tar"):
        return True
    return (
        os.path.isdir(item)
        and any(f.lower().endswith(".tar") for f in os.listdir(item))
        and not any(os.path.isfile(os.path.join(item, f)) for f in ("dataset_dict.json", "state.json"))
    )


def is_shards(path) -> bool:
    """Whether an annotation path (or list of them) names WebDataset shards (see the module docstring)."""
    items = [path] if isinstance(path, (str, os.PathLike)) else list(path) if isinstance(path, (list, tuple)) else []
    return bool(items) and all(isinstance(p, (str, os.PathLike)) and _is_shard_spec(os.fspath(p)) for p in items)


def shard_paths(path) -> list[str]:
    """The shard files of a folder, brace pattern, file or list of them, in order; one-line errors."""
    items = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    out: list[str] = []
    for item in map(os.fspath, items):
        if os.path.isdir(item):
            out += sorted(os.path.join(item, f) for f in os.listdir(item) if f.lower().endswith(".tar"))
            continue
        for file in expand_pattern(item) if _BRACES.search(item) else [item]:
            if "://" in file or file.startswith("pipe:"):
                raise AnnotationError(f"{file}: shards are read from local files (copy them first)")
            if not os.path.isfile(file):
                raise AnnotationError(f"{file}: no such shard file")
            out.append(file)
    if not out:
        raise AnnotationError(f"{path}: no .tar shards found")
    return out


def expand_pattern(pattern: str) -> list[str]:
    """The files of a brace pattern (webdataset's own expansion, braceexpand), counted first: a
    pattern of more than :data:`MAX_PATTERN_SHARDS` names is one line, not a list built in memory."""
    try:
        from braceexpand import UnbalancedBracesError, braceexpand
    except ImportError:
        raise AnnotationError(
            f"{pattern}: brace patterns need the braceexpand package (pip install -e '.[webdataset]')"
        ) from None
    try:
        count = count_expansion(pattern)
    except UnbalancedBracesError:
        raise AnnotationError(f"{pattern}: unbalanced braces in the shard pattern") from None
    if count > MAX_PATTERN_SHARDS:
        raise AnnotationError(
            f"{pattern}: the pattern names {count:,} shard files, more than the {MAX_PATTERN_SHARDS:,} "
            "one pattern may name (a typo in a range?)"
        )
    return list(braceexpand(pattern))


def count_expansion(pattern: str) -> int:
    """How many strings ``braceexpand(pattern)`` gives, computed from its grammar without expanding:
    a pattern is the product of its parts, a ``{a,b,...}`` sequence the sum of its items' counts, a
    ``{m..n[..step]}`` range its length. UnbalancedBracesError as braceexpand."""
    from braceexpand import UnbalancedBracesError, alphabet

    def items(text: str) -> list[str | None]:
        """The parts of a pattern at depth 0: brace expressions (their inside) and literals (None)."""
        out, start, depth, pos = [], 0, 0, 0
        while pos < len(text):
            if text[pos] == "\\":
                pos += 2
                continue
            if text[pos] == "{":
                depth += 1
                if depth == 1:
                    start = pos
            elif text[pos] == "}":
                depth -= 1
                if depth == 0:
                    out.append(text[start + 1 : pos])
            pos += 1
        if depth != 0:
            raise UnbalancedBracesError(f"Unbalanced braces: {text!r}")
        return out

    def expression(expr: str) -> int:
        ints = re.match(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$", expr)
        chars = re.match(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$", expr)
        if ints or chars:
            first, last, step = (ints or chars).groups()
            step = (int(step) or 1) if step else 1
            if ints:
                return len(
                    range(int(first), int(last) + 1, step)
                    if int(first) < int(last)
                    else range(int(first), int(last) - 1, -step)
                )
            a, b = alphabet.index(first), alphabet.index(last)
            return len(alphabet[a : b + 1 : step] if a < b else alphabet[a : (b or -len(alphabet)) - 1 : -step])
        parts, start, depth, pos = [], 0, 0, 0  # a sequence: the items between commas at depth 0
        while pos < len(expr):
            if expr[pos] == "\\":
                pos += 2
                continue
            depth += {"{": 1, "}": -1}.get(expr[pos], 0)
            if expr[pos] == "," and depth == 0:
                parts.append(expr[start:pos])
                start = pos + 1
            pos += 1
        if depth != 0 or not parts:  # not a sequence: braceexpand keeps the braces and expands inside
            return pattern_count(expr)
        return sum(pattern_count(p) for p in (*parts, expr[start:]))

    def pattern_count(text: str) -> int:
        count = 1
        for expr in items(text):
            count *= expression(expr)
        return count

    return pattern_count(pattern)


# ---------------------------------------------------------------------------------------- index
@dataclass(frozen=True)
class Member:
    """Where a sample's image lies: its shard file, byte offset and size, and its name (for errors)."""

    shard: str
    offset: int
    size: int
    name: str

    def read(self, file=None) -> bytes:
        """The member's bytes (from ``file``, an open binary file of the shard, or by opening it)."""
        if file is None:
            with open(self.shard, "rb") as f:
                return self.read(f)
        file.seek(self.offset)
        return file.read(self.size)


@dataclass
class ShardIndex:
    """The records of a set of shards (``imgid`` = position over the shards) and their images."""

    shards: list[str]
    records: list[ImageRecord]
    members: dict[int, Member]  # imgid -> image member
    shard_of: dict[int, int]  # imgid -> index into shards


def _text(data: bytes, member: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise AnnotationError(f"{member}: not UTF-8 text") from None


def _sample_record(imgid: int, files: dict, image: Member | None) -> ImageRecord:
    """The record of one sample's text files (``files``: extension -> bytes); AnnotationError for a problem."""
    meta = {}
    if "json" in files:
        meta = parse_json(_text(files["json"], ".json"), ".json", AnnotationError)  # any text: one line
        if not isinstance(meta, dict):
            raise AnnotationError(f".json: expected an object, got {type(meta).__name__}")
    if image is None:
        raise AnnotationError(f"no image ({'|'.join(IMAGE_EXTS[:4])} member)")
    captions = meta.get("captions", meta.get("caption"))
    if captions is None and "txt" in files:
        captions = _text(files["txt"], ".txt")
    captions = [captions] if isinstance(captions, str) else [] if captions is None else captions
    if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
        raise AnnotationError(".json captions: expected a string or a list of strings")
    check_texts(captions, ".json captions")
    tokens = meta.get("tokens")
    if _token_lists(tokens, len(captions)):
        check_texts([w for t in tokens for w in t], ".json tokens")
    pairs = (
        [(c.strip(), t) for c, t in zip(captions, tokens)]
        if _token_lists(tokens, len(captions))
        else [(c.strip(), tokenize(c)) for c in captions]
    )
    pairs = [(c, [w.strip().lower() for w in t if w.strip()]) for c, t in pairs]
    pairs = [(c or " ".join(t), t) for c, t in pairs if t]
    if not pairs:
        raise AnnotationError("no usable captions (a .txt member, or .json 'captions' / 'caption')")
    raw_split = meta.get("split", "train")
    split = SPLIT_NAMES.get(str(raw_split).lower())
    if split is None:
        raise AnnotationError(f"unknown split {raw_split!r} (expected train, val/validation, test or restval)")
    image_id = meta.get("image_id")
    if image_id is not None:
        check_id(image_id, ".json image_id")
    objects = check_objects(meta["objects"], ".json objects") if isinstance(meta.get("objects"), list) else []
    size = check_image_size(*(meta.get(k) if is_int(meta.get(k)) else None for k in ("width", "height")), ".json")
    return ImageRecord(
        imgid,
        imgid if image_id is None else image_id,
        f"{os.path.basename(image.shard)}/{image.name}",
        split,
        [c for c, _ in pairs],
        [t for _, t in pairs],
        objects,
        *size,
    )


def _token_lists(tokens, n: int) -> bool:
    return (
        isinstance(tokens, list)
        and len(tokens) == n
        and all(isinstance(t, list) and all(isinstance(w, str) for w in t) for t in tokens)
    )


def _shard_samples(shard: str) -> dict[str, tuple[dict, list]]:
    """key -> (text files {extension: bytes}, [image Member]) of one shard: every member's header is
    checked (data/tars.py, the check every shard reader shares) before its bytes are read (text)
    or skipped (images)."""
    samples: dict[str, tuple[dict, list]] = {}
    for info, tar in tar_members(shard, AnnotationError):
        match = _KEY.match(info.name)
        if not match or os.path.basename(info.name).startswith("."):
            continue
        ext = match.group(2).lower()
        files, image = samples.setdefault(match.group(1), ({}, []))
        if ext in IMAGE_EXTS:
            image.append(Member(shard, info.offset_data, info.size, info.name))
        elif ext in TEXT_EXTS:
            try:
                files[ext] = tar.extractfile(info).read()
            except TAR_ERRORS as err:
                raise AnnotationError(f"{shard}: damaged tar file ({' '.join(str(err).split())[:160]})") from None
    return samples


def read_index(path, merge_restval: bool = True, problems: list | None = None) -> ShardIndex:
    """The :class:`ShardIndex` of shards named by ``path`` (a pass over headers and text: no image is read).

    A problem of one sample raises :class:`AnnotationError` naming the shard and key, or with
    ``problems`` is appended there and the sample left out, so that one reading lists them all."""
    shards = shard_paths(path)
    records: list[ImageRecord] = []
    members: dict[int, Member] = {}
    shard_of: dict[int, int] = {}
    seen: dict[int, str] = {}
    position = 0
    for s, shard in enumerate(shards):
        samples = _shard_samples(shard)
        for key, (files, image) in samples.items():
            where = f"{shard}: {key}"
            try:
                if len(image) > 1:
                    raise AnnotationError(f"{len(image)} images ({', '.join(m.name for m in image)}): expected one")
                record = _sample_record(position, files, image[0] if image else None)
                if record.image_id in seen:
                    raise AnnotationError(f"image_id {record.image_id} already used by {seen[record.image_id]}")
            except AnnotationError as err:
                if problems is None:
                    raise AnnotationError(f"{where}: {err}") from None
                problems.append(f"{where}: {err}")
                position += 1
                continue
            seen[record.image_id] = where
            if merge_restval and record.split == "restval":
                record.split = "train"
            records.append(record)
            members[position], shard_of[position] = image[0], s
            position += 1
    return ShardIndex(shards, records, members, shard_of)


# ---------------------------------------------------------------------------------------- images
def decode_image(data: bytes, name: str):
    """An image member's bytes -> RGB PIL image, by data/images.py's rules (its accepted formats only,
    EXIF orientation, transparency over white); a damaged or refused image is one ImageError naming it."""
    from PIL import Image, UnidentifiedImageError

    from captioning.data.images import IMAGE_FORMATS, _describe_bomb, to_rgb

    if not data:
        raise ImageError(f"{name}: empty image member (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
                img.load()
                return to_rgb(img)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
        raise ImageTooLargeError(f"{name}: {_describe_bomb(err)}") from None
    except UnidentifiedImageError:
        raise NotAnImageError(f"{name}: not an image of an accepted format ({', '.join(IMAGE_FORMATS)})") from None
    except Exception as err:  # noqa: BLE001 -- as data/images.py: a decoder may raise anything on damaged bytes
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        raise ImageError(f"{name}: unreadable image, damaged or truncated ({detail})") from None


class ShardImageDataset(ImageDataset):
    """One sample per image of ``records``, read from its shard by offset (evaluation; map-style)."""

    def __init__(
        self,
        records: Sequence[ImageRecord],
        index: ShardIndex,
        image_size: int,
        features=None,
        interpolation: str = "bilinear",
    ):
        super().__init__(records, "", image_size, features, interpolation=interpolation)
        self.members = index.members

    def visual(self, record: ImageRecord) -> torch.Tensor:
        if self.features is not None:
            return self.features[record.image_id]
        from captioning.data.images import to_tensor

        member = self.members[record.imgid]
        return to_tensor(
            decode_image(member.read(), f"{member.shard}: {member.name}"), self.image_size, self.interpolation
        )


# ---------------------------------------------------------------------------------------- the format
class ShardAnnotations(Annotations):
    """The records of shards, whose images are read from the shards by their place in the index."""

    def __init__(self, index: ShardIndex):
        super().__init__(index.records)
        self.index = index

    def image_bytes(self, record: ImageRecord, images_root: str) -> bytes:
        return self.index.members[record.imgid].read()

    def read_image(self, record: ImageRecord, images_root: str):
        member = self.index.members[record.imgid]
        return decode_image(member.read(), f"{member.shard}: {member.name}")

    def image_dataset(
        self, records, images_root, image_size, features=None, cache_images=False, interpolation="bilinear"
    ) -> ImageDataset:
        return ShardImageDataset(records, self.index, image_size, features=features, interpolation=interpolation)

    def train_loader(self, data) -> ShardLoader:
        """The training pairs, streamed over DDP ranks and loader workers (``data``: the CaptionData)."""
        if data.bucket_by_length:
            raise ConfigError(
                "data.bucket_by_length needs the captions' lengths up front: set it false to stream WebDataset shards"
            )
        data.records("train")  # no training images: one line
        world, rank = data.replicas()
        stream = ShardStream(
            self.index,
            data.vocab,
            data.max_length,
            data.image_size,
            data.batch_size,
            seed=torch.initial_seed() % 2**31,
            num_replicas=world,
            rank=rank,
            group=data.group_captions,
            shuffle_buffer=data.shuffle_buffer,
            features=data.feature_cache(),
            interpolation=data.interpolation,
        )
        collate = Collate(Vocabulary.pad_id, stream.visual_key, stream.visual_shape, data.on_bad_image, captions=True)
        return ShardLoader(
            stream,
            data.batch_size,
            epoch_of=data.epoch_of(),
            num_workers=data.num_workers,
            pin_memory=data.pin_memory,
            collate_fn=collate,
        )


@FORMATS.register("webdataset")
class WebDatasetFormat(AnnotationFormat):
    """WebDataset shards: a ``.tar`` file, a brace pattern, a folder of ``.tar`` files, or a list of them."""

    description = "WebDataset shards"
    priority = 20
    several = True

    def detect(self, path: str) -> bool:
        return is_shards(path)

    def load(self, paths, split_file, merge_restval, problems):
        return read_index(paths, merge_restval, problems).records

    def read(self, paths, split_file=None, merge_restval=True, problems=None) -> ShardAnnotations:
        return ShardAnnotations(read_index(paths, merge_restval, problems))

    def default_images_root(self, path: str) -> str:
        # images are read from the shards; the folder only names them in messages
        return path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))


# ---------------------------------------------------------------------------------------- training
class ShardStream(IterableDataset):
    """The training pairs of shards, streamed (see the module docstring for the epoch's plan).

    Yields the samples of CaptionPairDataset (``group=False``: ``"captions"`` (T,) long) or of
    CaptionGroupDataset (``group=True``: a list of (T_j,) tensors): ``{"images": (3, S, S) float,
    "image_ids": int, "captions": ...}``, or ``{"error": message}`` for an unreadable image.
    :meth:`start` sets the epoch (and the batches of each worker to skip) before each iteration.
    """

    def __init__(
        self,
        index: ShardIndex,
        vocab: Vocabulary,
        max_length: int | None,
        image_size: int,
        batch_size: int,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        group: bool = False,
        shuffle_buffer: int = 1000,
        features=None,
        interpolation: str = "bilinear",
    ):
        self.index, self.vocab, self.max_length, self.image_size = index, vocab, max_length, image_size
        self.interpolation = interpolation  # the resize's filter (data/images.py: INTERPOLATIONS)
        self.batch_size, self.seed, self.num_replicas, self.rank = batch_size, seed, num_replicas, rank
        self.group, self.shuffle_buffer, self.features = group, shuffle_buffer, features
        self.visual_key = "features" if features is not None else "images"
        self.visual_shape = tuple(features.grid_shape) if features is not None else (3, image_size, image_size)
        self.records = {r.imgid: r for r in index.records if r.split == "train"}
        # (imgid, caption index or -1) of each training shard's units, in file order
        per_shard: dict[int, list] = {}
        for imgid, r in self.records.items():
            units = [(imgid, -1)] if group else [(imgid, c) for c in range(len(r.tokens))]
            per_shard.setdefault(index.shard_of[imgid], []).extend(units)
        self.shard_units = [np.asarray(per_shard[s], dtype=np.int64).reshape(-1, 2) for s in sorted(per_shard)]
        self.size = sum(len(u) for u in self.shard_units)  # units of an epoch, over all ranks
        self.per_rank = -(-self.size // num_replicas)
        self.epoch, self.skip = 0, ()

    def worker_batches(self, workers: int) -> list[int]:
        """Batches of each of ``workers`` loader workers in an epoch of this rank."""
        batches = -(-self.per_rank // self.batch_size)
        return [(w + 1) * batches // workers - w * batches // workers for w in range(workers)]

    def start(self, epoch: int, skip: Sequence[int] = ()) -> None:
        """The epoch to stream next, and the batches each worker skips (a resumed epoch)."""
        self.epoch, self.skip = epoch, tuple(skip)

    def rank_units(self, epoch: int) -> np.ndarray:
        """(N, 2) units of this rank in ``epoch``, in stream order (before the shuffle buffer)."""
        g = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(len(self.shard_units), generator=g).tolist()
        units = np.concatenate([self.shard_units[i] for i in order]) if order else np.zeros((0, 2), np.int64)
        total = self.per_rank * self.num_replicas
        if total > len(units) > 0:  # every rank the same number of units: pad with the epoch's first ones
            units = np.concatenate([units, np.resize(units, (total - len(units), 2))])
        return units[self.rank * self.per_rank : (self.rank + 1) * self.per_rank]

    def worker_units(self, epoch: int, worker: int, workers: int) -> np.ndarray:
        counts = self.worker_batches(workers)
        first = sum(counts[:worker]) * self.batch_size
        return self.rank_units(epoch)[first : first + counts[worker] * self.batch_size]

    def _read(self, units: np.ndarray) -> Iterator[tuple[int, int, bytes | None]]:
        """(imgid, caption, image bytes or None with a feature cache) of each unit, in file order;
        the units of one image share one read."""
        file, shard, last, data = None, None, None, None
        try:
            for imgid, caption in units.tolist():
                if self.features is None and imgid != last:
                    member = self.index.members[imgid]
                    if member.shard != shard:
                        if file is not None:
                            file.close()
                        file, shard = open(member.shard, "rb"), member.shard
                    data = member.read(file)
                last = imgid
                yield imgid, caption, data
        finally:
            if file is not None:
                file.close()

    def _shuffled(self, items: Iterator, rng: np.random.Generator) -> Iterator:
        """A shuffle buffer: each item swapped with a random one of the last ``shuffle_buffer``."""
        buffer = []
        for item in items:
            if len(buffer) < self.shuffle_buffer:
                buffer.append(item)
                continue
            j = int(rng.integers(len(buffer)))
            buffer[j], item = item, buffer[j]
            yield item
        for j in rng.permutation(len(buffer)).tolist():
            yield buffer[j]

    def _sample(self, imgid: int, caption: int, data: bytes | None) -> dict:
        record = self.records[imgid]
        try:
            if data is None:
                visual = self.features[record.image_id]
            else:
                from captioning.data.images import to_tensor

                member = self.index.members[imgid]
                visual = to_tensor(
                    decode_image(data, f"{member.shard}: {member.name}"), self.image_size, self.interpolation
                )
        except ImageError as err:
            return {"error": str(err)}
        encode = lambda t: torch.tensor(self.vocab.encode(t, self.max_length), dtype=torch.long)  # noqa: E731
        captions = [encode(t) for t in record.tokens] if caption < 0 else encode(record.tokens[caption])
        return {self.visual_key: visual, "image_ids": record.image_id, "captions": captions}

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        units = self.worker_units(self.epoch, worker, workers)
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
        skip = (self.skip[worker] if worker < len(self.skip) else 0) * self.batch_size
        for n, item in enumerate(self._shuffled(self._read(units), rng)):
            if n >= skip:  # a resumed epoch's first units are read (the buffer needs them), not decoded
                yield self._sample(*item)


def served_per_worker(counts: Sequence[int], batches: int) -> tuple[list[int], int]:
    """(batches each worker skips, batches the loader then drops) to resume after ``batches``.

    The DataLoader takes the workers' batches in turn from the first worker on, passing over the
    workers that are done; so the workers skip whole turns, and the loader drops the rest of a turn
    (fewer batches than workers, read and dropped)."""
    done = [0] * len(counts)
    while True:
        turn = [w for w, c in enumerate(counts) if done[w] < c]
        if not turn or len(turn) > batches:
            return done, batches
        for w in turn:
            done[w] += 1
        batches -= len(turn)


class ShardLoader(DataLoader):
    """The DataLoader of a :class:`ShardStream`, resumable mid-epoch (its state is saved in checkpoints).

    ``epoch_of``: a callable giving the epoch to stream (the trainer's); without it the loader counts
    the epochs it has completed. Workers are started for each epoch (they take the epoch with them).
    """

    def __init__(self, stream: ShardStream, batch_size: int, epoch_of=None, **kwargs):
        kwargs["persistent_workers"] = False
        super().__init__(stream, batch_size=batch_size, **kwargs)
        self._epoch_of, self._epochs_done = epoch_of, 0
        self._epoch, self._served, self._resume = 0, 0, None

    def _workers(self) -> int:
        return max(1, self.num_workers)

    def __len__(self) -> int:
        return sum(self.dataset.worker_batches(self._workers()))

    def __iter__(self):
        epoch = int(self._epoch_of()) if self._epoch_of is not None else self._epochs_done
        resume, self._resume = self._resume, None
        skip = resume[1] if resume is not None and resume[0] == epoch else 0
        in_workers, dropped = served_per_worker(self.dataset.worker_batches(self._workers()), skip)
        self.dataset.start(epoch, in_workers)
        self._epoch, self._served = epoch, skip - dropped
        for batch in super().__iter__():
            self._served += 1
            if self._served > skip:
                yield batch
        self._epochs_done = epoch + 1

    def _settings(self) -> dict:
        stream = self.dataset
        return {
            "batch_size": self.batch_size,
            "seed": stream.seed,
            "num_replicas": stream.num_replicas,
            "num_workers": self._workers(),
            "shuffle_buffer": stream.shuffle_buffer,
            "units": stream.size,
        }

    def state_dict(self) -> dict:
        """The epoch, the batches served in it, and the settings the epoch's order is drawn from."""
        return {
            "epoch": self._epoch,
            "batches": self._served,
            "samples": self._served * self.batch_size,
            "stream": "webdataset",
            **self._settings(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue ``state``'s epoch where it stopped; a one-line ConfigError if this loader would
        stream another order than the one that saved it."""
        if state.get("stream") != "webdataset":
            raise ConfigError(
                "the checkpoint's training loader read an annotation file, this run streams "
                "WebDataset shards: the resumed epoch would not continue the saved one"
            )
        for key, value in self._settings().items():
            if key in state and state[key] != value:
                raise ConfigError(
                    f"the training loader's {key} is {state[key]!r} in the checkpoint, {value!r} here: "
                    "the resumed epoch would not continue the saved one"
                )
        self._resume = (int(state["epoch"]), int(state["batches"]))
        self._epochs_done = int(state["epoch"])


# ---------------------------------------------------------------------------------------- writing
def _image_payload(path: str) -> tuple[str, bytes]:
    """(extension, bytes) of an image file for a shard: JPEG, PNG and WebP as stored, other formats as PNG."""
    from PIL import Image

    from captioning.data.images import IMAGE_FORMATS, load_image

    with open(path, "rb") as f:
        data = f.read()
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
            kind = img.format
    except Exception:  # noqa: BLE001 -- load_image below says why, in one line
        kind = None
    if kind in ("JPEG", "PNG", "WEBP"):
        return {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[kind], data
    buffer = io.BytesIO()
    load_image(path).save(buffer, format="PNG")
    return "png", buffer.getvalue()


def write_shards(
    records: Sequence[ImageRecord],
    images_root: str,
    out_dir: str,
    shard_size: int = 1000,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, list[str]]:
    """Write ``records`` as shards ``out_dir/{split}-NNNNNN.tar`` of ``shard_size`` samples: per sample
    its image (JPEG, PNG, WebP as stored, other formats as PNG) and ``KEY.json`` (captions, tokens,
    split, image_id, and objects / width / height where the record has them). The training samples
    are written in an order drawn from ``seed`` (a stream reads shards in order: mixing them once
    makes its shuffle buffer enough). Returns {split: [shard files]}."""
    from tqdm.auto import tqdm

    try:
        import webdataset as wds
    except ImportError:
        raise ConfigError("writing shards needs the webdataset package (pip install -e '.[webdataset]')") from None

    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ConfigError(f"shard size: expected an integer >= 1, got {shard_size!r}")
    if os.path.isdir(out_dir) and any(f.lower().endswith(".tar") for f in os.listdir(out_dir)):
        raise ConfigError(f"{out_dir}: holds .tar files already; write shards to a new or empty folder")
    names: dict[str, list[str]] = {}
    splits = sorted({r.split for r in records}, key=lambda s: (("train", "val", "test", "restval") + (s,)).index(s))
    # a new (or empty) folder is written whole in a temporary sibling, renamed into place at the end;
    # in a folder holding other files the shards are written as NAME.tar.partial, renamed to NAME.tar
    # once every one is whole: a run killed between shards leaves no .tar a reader would trust
    with folder_writer(out_dir, ConfigError, "the shards' folder") as folder:
        for stale in os.listdir(folder):
            if _PARTIAL.fullmatch(stale):  # a killed run's
                os.unlink(os.path.join(folder, stale))
        for split in splits:
            part = [r for r in records if r.split == split]
            if split == "train":
                part = [part[i] for i in np.random.default_rng(seed).permutation(len(part)).tolist()]
            pattern = os.path.join(folder, f"{split}-%06d.tar.partial")
            with wds.ShardWriter(pattern, maxcount=shard_size, verbose=0) as sink:
                for n, r in enumerate(
                    tqdm(part, desc=f"writing {split} shards", unit="img", disable=None if progress else True)
                ):
                    ext, data = _image_payload(os.path.join(images_root, r.path))
                    meta = {
                        "captions": list(r.captions),
                        "tokens": [list(t) for t in r.tokens],
                        "split": split,
                        "image_id": r.image_id,
                        "source": r.path,
                    }
                    meta.update(
                        {k: v for k, v in (("objects", r.objects), ("width", r.width), ("height", r.height)) if v}
                    )
                    sink.write({"__key__": f"{split}{n:09d}", ext: data, "json": json.dumps(meta).encode()})
            names[split] = sorted(f for f in os.listdir(folder) if re.fullmatch(rf"{split}-\d{{6}}\.tar\.partial", f))
        for files in names.values():
            for f in files:
                os.replace(os.path.join(folder, f), os.path.join(folder, f.removesuffix(".partial")))
    return {split: [os.path.join(out_dir, f.removesuffix(".partial")) for f in files] for split, files in names.items()}
