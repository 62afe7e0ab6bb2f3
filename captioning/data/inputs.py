"""Images to caption, as a stream: what ``captioning caption`` / ``attend`` and
``Captioner.caption_files`` read, in bounded memory whatever the number of images.

**Inputs** (:func:`iter_sources`), each argument in the order given:

- a file: itself;
- a folder: its images and its subfolders', walked one folder at a time, in the order of their
  sorted paths (the order ``sorted(rglob)`` gives, without listing the whole tree first);
- a glob pattern (``photos/*.jpg``): its matches, sorted;
- ``@list.txt``: the files it lists, one path per line (relative paths from the current folder;
  blank lines and lines starting with ``#`` are passed over), read as the stream goes;
- WebDataset shards (``x.tar`` or a brace pattern ``x-{000..009}.tar``): their image members, in file
  order, named ``SHARD:MEMBER``; only the tar headers are read while listing (the images are skipped
  by seeking), a member's bytes when its batch is read.

Nothing but the names and places of the images is held while listing: the pixels of an image exist
only while its batch is read and captioned.

**The loader** (:func:`load_batches`): the sources are cut into batches in the main process and each
batch is read by a worker (``num_workers`` processes of a PyTorch DataLoader; 0: in this process, and
PyTorch is not imported then), which decodes its images (data/images.py's rules) and turns each into
what the model takes (``prepare``: e.g. the resized uint8 pixels). Batches come back in input order;
at most ``2 * num_workers`` batches are read ahead. A bad image is an item with an ``error`` (one line
naming it), never an exception: the images beside it are captioned.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from captioning.data.images import IMAGE_SUFFIXES
from captioning.errors import CaptioningError, ConfigError, ImageError

#: image members of a shard read as images (file suffixes, as data/formats/webdataset.py's IMAGE_EXTS)
SHARD_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
#: the most bytes one shard member may hold to be read as an image (as data/formats/webdataset.py's)
MAX_MEMBER_BYTES = 1 << 30
_BRACES = re.compile(r"\{[^{}]*\}")


class Source(NamedTuple):
    """One image to read: ``name`` (its path, or ``SHARD:MEMBER``) and, for a shard member, where its
    bytes lie (shard file, offset, size). ``error``: an argument that names no image, kept in its
    place in the stream (:func:`iter_sources` with ``inline``)."""

    name: str
    shard: str | None = None
    offset: int = 0
    size: int = 0
    error: str | None = None


class Loaded(NamedTuple):
    """One image of a batch as the loader gives it: ``name``, ``image`` (what ``prepare`` made of it;
    None on error), ``error`` (one line; None when read)."""

    name: str
    image: Any = None
    error: str | None = None


# ------------------------------------------------------------------------------------------ listing
def is_list_item(item: str) -> bool:
    """``@list.txt``: a file listing image paths."""
    return item.startswith("@") and len(item) > 1


def is_shard_item(item: str) -> bool:
    """A shard file (``.tar``) or a brace pattern of them."""
    return item.lower().endswith(".tar") and not os.path.isdir(item)


def check_items(items: Iterable[str]) -> list[str]:
    """The arguments as strings, checked before anything is loaded: a ``@list`` file must exist and
    be readable (one-line ConfigError naming it)."""
    items = [os.fspath(i) for i in items]
    for item in items:
        if is_list_item(item):
            path = item[1:]
            if not os.path.isfile(path):
                raise ConfigError(f"{item}: no such list file {path!r} (@FILE lists image paths, one per line)")
            if not os.access(path, os.R_OK):
                raise ConfigError(f"{item}: cannot read the list file {path!r} (permission denied)")
    return items


def _walk(folder: str) -> Iterator[str]:
    """The image files under ``folder`` in the order of their sorted paths, one folder listed at a time.

    A folder's entries are sorted by name, a subfolder's name followed by "/": that is where its files
    fall among the sorted paths. Links to folders are not followed (as ``Path.rglob``)."""
    try:
        with os.scandir(folder) as it:
            entries = [(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e.path) for e in it]
    except OSError:
        return
    for key, path in sorted(entries):
        if key.endswith("/"):
            yield from _walk(path)
        elif os.path.splitext(key)[1].lower() in IMAGE_SUFFIXES and os.path.isfile(path):
            yield path


def _listed(list_file: str) -> Iterator[str]:
    with open(list_file, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            path = line.rstrip("\r\n")
            if path.strip() and not path.lstrip().startswith("#"):
                yield path


def shard_files(item: str) -> list[str]:
    """The shard files of a ``.tar`` item (a brace pattern expanded as webdataset does)."""
    if not _BRACES.search(item):
        return [item]
    from captioning.data.formats.webdataset import shard_paths

    return shard_paths(item)


def _shard_members(shard: str) -> Iterator[Source]:
    """A shard's image members (name, offset, size), reading headers only; a damaged shard raises
    ImageError naming it after the members read before the damage."""
    import tarfile

    try:
        with tarfile.open(shard, "r:") as tar:
            while True:
                info = tar.next()
                tar.members.clear()  # the headers are streamed: TarFile would keep every one read
                if info is None:
                    return
                if info.isfile() and info.name.rsplit(".", 1)[-1].lower() in SHARD_IMAGE_EXTS:
                    yield Source(f"{shard}:{info.name}", shard, info.offset_data, info.size)
    except (tarfile.TarError, OSError) as err:
        raise ImageError(f"{shard}: unreadable shard ({' '.join(str(err).split())[:200]})") from None


def _item_sources(item: str) -> Iterator[Source]:
    if is_list_item(item):
        yield from (Source(p) for p in _listed(item[1:]))
    elif os.path.isdir(item):
        yield from (Source(p) for p in _walk(item))
    elif is_shard_item(item):
        for shard in shard_files(item):
            if not os.path.isfile(shard):
                raise ImageError(f"{shard}: no such shard file")
            yield from _shard_members(shard)
    elif any(ch in item for ch in "*?[") and not os.path.exists(item):
        yield from (Source(p) for p in sorted(glob.glob(item)))
    else:
        yield Source(item)


def iter_sources(items: Iterable[str], problems: list | None = None, inline: bool = False) -> Iterator[Source]:
    """The images the arguments name, in order (see the module docstring), listed as the stream goes.

    An argument that names no image (an empty folder, a pattern matching nothing, an empty list, an
    unreadable shard) is, with ``inline``, a Source with its ``error`` in its place; else appended
    to ``problems`` as (argument, reason) when given; else raised as one ImageError."""
    for item in items:
        item = os.fspath(item)
        found, reason = 0, None
        try:
            for source in _item_sources(item):
                found += 1
                yield source
        except ImageError as err:
            reason = str(err)
        if not found and reason is None:
            reason = f"{item}: no images found (an empty folder or list, or a pattern that matches nothing)"
        if reason is None:
            continue
        if inline:
            yield Source(item, error=reason)
        elif problems is not None:
            problems.append((item, reason))
        else:
            raise ImageError(reason)


def count_sources(items: Iterable[str]) -> int:
    """How many images :func:`iter_sources` will give (a listing pass: no image is read)."""
    return sum(1 for _ in iter_sources(items, problems=[]))


# ------------------------------------------------------------------------------------------ reading
def read_source(source: Source):
    """The RGB PIL image of a source, by data/images.py's rules; ImageError (one line) if it cannot be."""
    from captioning.data.images import load_image

    if source.shard is None:
        return load_image(source.name)
    if source.size > MAX_MEMBER_BYTES:
        raise ImageError(f"{source.name}: member of {source.size:,} bytes, over the limit of {MAX_MEMBER_BYTES:,}")
    from captioning.data.formats.webdataset import decode_image

    try:
        with open(source.shard, "rb") as f:
            f.seek(source.offset)
            data = f.read(source.size)
    except OSError as err:
        raise ImageError(f"{source.name}: cannot read the shard ({err.strerror or err})") from None
    return decode_image(data, source.name)


def source_bytes(source: Source) -> bytes | None:
    """The bytes of a source's file or shard member, None where they cannot be read (the reading
    route then says why)."""
    try:
        if source.shard is None:
            with open(source.name, "rb") as f:
                return f.read()
        if source.size > MAX_MEMBER_BYTES:
            return None
        with open(source.shard, "rb") as f:
            f.seek(source.offset)
            return f.read(source.size)
    except OSError:
        return None


def read_batch(sources: list[Source], prepare: Callable | None = None, encoded: bool = False) -> list[Loaded]:
    """One batch read: each source's image made ready by ``prepare`` (default: the PIL image), or its error.
    ``encoded``: a JPEG the GPU decodes as the CPU would (data/images.py: jpeg_for_device) is its
    bytes instead, a 1-D uint8 array (``caption --decode-device``)."""
    out = []
    for source in sources:
        if source.error is not None:
            out.append(Loaded(source.name, error=source.error))
            continue
        if encoded:
            from captioning.data.images import jpeg_for_device

            data = source_bytes(source)
            if data is not None and jpeg_for_device(data):
                import numpy as np

                out.append(Loaded(source.name, np.frombuffer(bytearray(data), dtype=np.uint8)))
                continue
        try:
            image = read_source(source)
            out.append(Loaded(source.name, prepare(image) if prepare is not None else image))
        except ImageError as err:
            out.append(Loaded(source.name, error=str(err)))
    return out


def batched(sources: Iterable[Source], batch_size: int) -> Iterator[list[Source]]:
    batch: list[Source] = []
    for source in sources:
        batch.append(source)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


class _BatchReader:
    """The DataLoader's dataset: a batch of sources (the sampler's "index") -> its Loaded items."""

    def __init__(self, prepare: Callable | None, encoded: bool = False):
        self.prepare, self.encoded = prepare, encoded

    def __getitem__(self, sources: list[Source]) -> list[Loaded]:
        return read_batch(sources, self.prepare, self.encoded)


class _Batches:
    """The DataLoader's sampler: the batches of sources, listed lazily in the main process."""

    def __init__(self, batches: Iterable[list[Source]]):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def _as_is(batch):
    return batch


def check_loader_settings(batch_size: int, num_workers: int) -> None:
    """One-line ConfigErrors for a batch size below 1 or a negative number of workers."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"num_workers: expected an integer >= 0, got {num_workers!r}")


def load_batches(
    sources: Iterable[Source],
    prepare: Callable | None = None,
    batch_size: int = 16,
    num_workers: int = 0,
    encoded: bool = False,
) -> Iterator[list[Loaded]]:
    """The sources' images, read ``batch_size`` at a time by ``num_workers`` worker processes (0: here),
    in input order (see the module docstring). ``prepare`` (picklable: a module-level function or a
    partial of one) turns each RGB PIL image into what the caller takes; with ``encoded`` the JPEGs
    a GPU may decode are their bytes (:func:`read_batch`)."""
    check_loader_settings(batch_size, num_workers)
    batches = batched(sources, batch_size)
    if num_workers == 0:
        for batch in batches:
            yield read_batch(batch, prepare, encoded)
        return
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        raise CaptioningError("loader workers need PyTorch (pip install torch), or use --num-workers 0") from None
    loader = DataLoader(
        _BatchReader(prepare, encoded),
        sampler=_Batches(batches),
        batch_size=None,
        num_workers=num_workers,
        collate_fn=_as_is,
        prefetch_factor=2,
    )
    yield from loader


# ------------------------------------------------------------------------------------------ preparing
def model_pixels(image, sizes: tuple[tuple[int, str], ...]) -> tuple:
    """An RGB image -> one uint8 (3, S, S) array per (size, interpolation) of ``sizes``: the resize of
    data/images.py (``to_pixels``), done in the loader's workers."""
    from captioning.data.images import to_pixels

    return tuple(to_pixels(image, size, interpolation) for size, interpolation in sizes)


def model_pixels_of(sizes) -> Callable:
    """The picklable ``prepare`` of :func:`load_batches` that resizes to a model's ``sizes``."""
    import functools

    return functools.partial(model_pixels, sizes=tuple((int(s), str(i)) for s, i in sizes))
