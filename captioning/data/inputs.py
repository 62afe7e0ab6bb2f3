"""Images to caption, as a stream: what ``captioning caption`` / ``attend`` and
``Captioner.caption_files`` read, in bounded memory whatever the number of images.

**Inputs** (:func:`iter_sources`) are read in the order given. A folder gives its images and its
subfolders', in the order of their sorted paths, walked one folder at a time without recursion; a glob
pattern gives its matches, sorted. ``@list.txt`` gives one path per line, from the current folder
(blank and ``#`` lines passed over; read as the stream goes). WebDataset shards (``x.tar`` or
``x-{000..009}.tar``) give their image members in file order, named ``SHARD:MEMBER``, listed from their
tar headers, each checked before the next is read by data/tars.py; a missing or damaged shard is a
problem of that shard only. A file is itself.

Only the names and places of the images are held while listing; an image's pixels exist while its
batch is read and captioned. Only regular files are read (a FIFO or a device is one line, never
waited on), and what cannot be read is counted, not kept (:class:`Problems`).

**The loader** (:func:`load_batches`): batches are cut in the main process and read by
``num_workers`` DataLoader workers (0: here, without importing PyTorch), which decode the images
(data/images.py's rules) and ``prepare`` each for the model; batches come back in input order, at
most ``2 * num_workers`` read ahead. A bad image is an item with an ``error`` (one line naming it),
never an exception: the images beside it are captioned.
"""

from __future__ import annotations

import glob
import io
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from captioning.data.images import IMAGE_SUFFIXES
from captioning.data.tars import MAX_IMAGE_MEMBER, tar_members
from captioning.errors import CaptioningError, ConfigError, ImageError
from captioning.files import printable

#: image members of a shard read as images (file suffixes, as data/formats/webdataset.py's IMAGE_EXTS)
SHARD_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
#: the most bytes one image (a file on the encoded route, a shard member) is read as (data/tars.py's)
MAX_MEMBER_BYTES = MAX_IMAGE_MEMBER
#: the longest a name is shown in a message (a longer one is cut in its middle: a 40 MB list line
#: is a short error, not a second copy of the line)
SHOWN_NAME = 300
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


def normal_name(name: str) -> str:
    """A source's name as a resumed run compares it: a path made absolute (from the current folder)
    and normalised, so that ``dir/a.jpg``, ``./dir/a.jpg`` and ``$PWD/dir/a.jpg`` are one image; a
    shard member's ``SHARD:MEMBER`` with its shard's path so (the member's name as it is)."""
    cut = name.lower().find(".tar:")
    if cut >= 0:
        return os.path.normpath(os.path.abspath(name[: cut + 4])) + name[cut + 4 :]
    return os.path.normpath(os.path.abspath(name))


class Problems:
    """The images (or arguments) that could not be read, as (name, reason): counted, and the first
    ``keep`` kept (what the summary lines show), so that three million missing paths take no more
    memory than ten. The kept names and reasons are :func:`~captioning.files.printable` lines (a
    name of at most :data:`SHOWN_NAME` characters). Appended to like a list; ``len`` is the count."""

    def __init__(self, keep: int = 10):
        self.keep, self.count = keep, 0
        self.kept: list[tuple[str, str]] = []

    def append(self, problem: tuple[str, str]) -> None:
        self.count += 1
        if len(self.kept) < self.keep:
            name, reason = problem
            self.kept.append((printable(name, SHOWN_NAME), printable(reason, 2 * SHOWN_NAME)))

    def __iadd__(self, problems: Iterable[tuple[str, str]]) -> Problems:
        if isinstance(problems, Problems):  # another count: its kept ones, and its count
            self.kept += problems.kept[: max(0, self.keep - len(self.kept))]
            self.count += problems.count
            return self
        for problem in problems:
            self.append(problem)
        return self

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.kept)

    def __getitem__(self, index: int) -> tuple[str, str]:
        return self.kept[index]

    @property
    def unshown(self) -> int:
        """How many were counted but not kept."""
        return self.count - len(self.kept)


def error_line(name: str, reason: str) -> str:
    """A reader's one-line error about ``name``, with the name cut to :data:`SHOWN_NAME` characters
    and made printable where the reason repeats it (data/images.py's messages start with it)."""
    if reason.startswith(name):
        reason = printable(name, SHOWN_NAME) + reason[len(name) :]
    return printable(reason, 2 * SHOWN_NAME)


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
            shown = printable(path, SHOWN_NAME)
            if not os.path.exists(path):
                raise ConfigError(f"@{shown}: no such list file (@FILE lists image paths, one per line)")
            if not os.path.isfile(path):
                raise ConfigError(
                    f"@{shown}: not a regular file (a folder, a pipe or a device); @FILE names a list file"
                )
            if not os.access(path, os.R_OK):
                raise ConfigError(f"@{shown}: cannot read the list file (permission denied)")
    return items


def open_regular(path: str, error: type[CaptioningError] = ImageError):
    """``path`` opened for reading in binary, if it is a regular file: a FIFO or a device (which a
    read would wait on, or never finish) is one line of ``error``, checked on the opened file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as err:
        raise error(f"{printable(path, SHOWN_NAME)}: cannot read ({err.strerror or err})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise error(f"{printable(path, SHOWN_NAME)}: not a regular file (a pipe, a device or a folder)")
    return os.fdopen(fd, "rb")


def _entries(folder: str) -> Iterator[tuple[str, str]]:
    """A folder's (sort key, path) entries, sorted: a subfolder's key is its name and "/"."""
    try:
        with os.scandir(folder) as it:
            entries = [(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e.path) for e in it]
    except OSError:
        entries = []
    return iter(sorted(entries))


def _walk(folder: str) -> Iterator[str]:
    """The image files under ``folder`` in the order of their sorted paths, one folder listed at a time.

    A folder's entries are sorted by name, a subfolder's name followed by "/": that is where its files
    fall among the sorted paths. Links to folders are not followed (as ``Path.rglob``). The folders
    being walked are a stack of their sorted entries (no recursion, whatever the depth)."""
    stack = [_entries(folder)]
    while stack:
        for key, path in stack[-1]:
            if key.endswith("/"):
                stack.append(_entries(path))  # its entries come before the rest of this folder's
                break
            if os.path.splitext(key)[1].lower() in IMAGE_SUFFIXES and os.path.isfile(path):
                yield path
        else:
            stack.pop()


def _listed(list_file: str) -> Iterator[str]:
    with open_regular(list_file) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            path = line.rstrip("\r\n")
            if path.strip() and not path.lstrip().startswith("#"):
                yield path


def shard_files(item: str) -> list[str]:
    """The shard files of a ``.tar`` item (a brace pattern expanded as webdataset does; the files
    are not checked here: a missing one is a problem of that shard)."""
    if not _BRACES.search(item):
        return [item]
    from captioning.data.formats.webdataset import expand_pattern

    try:
        return expand_pattern(item)
    except CaptioningError as err:  # unbalanced braces, a pattern of a billion names
        raise ImageError(str(err)) from None


def _shard_members(shard: str) -> Iterator[Source]:
    """A shard's image members (name, offset, size), reading headers only, each checked before the
    next is read (data/tars.py); a damaged shard raises ImageError naming it after the members read
    before the damage."""
    for info, _ in tar_members(shard, ImageError):
        if info.name.rsplit(".", 1)[-1].lower() in SHARD_IMAGE_EXTS:
            yield Source(f"{shard}:{info.name}", shard, info.offset_data, info.size)


def _item_sources(item: str) -> Iterator[Source]:
    """The sources of one argument, a shard's problem as a Source with its ``error`` in its place."""
    if is_list_item(item):
        yield from (Source(p) for p in _listed(item[1:]))
    elif os.path.isdir(item):
        yield from (Source(p) for p in _walk(item))
    elif is_shard_item(item):
        for shard in shard_files(item):
            if not os.path.exists(shard):
                yield Source(shard, error=f"{printable(shard, SHOWN_NAME)}: no such shard file")
            elif not os.path.isfile(shard):
                yield Source(shard, error=f"{printable(shard, SHOWN_NAME)}: not a regular file, not a shard")
            else:
                try:
                    yield from _shard_members(shard)
                except ImageError as err:
                    yield Source(shard, error=str(err))
    elif any(ch in item for ch in "*?[") and not os.path.exists(item):
        yield from (Source(p) for p in sorted(glob.glob(item)))
    else:
        yield Source(item)


def iter_sources(
    items: Iterable[str], problems: list | Problems | None = None, inline: bool = False
) -> Iterator[Source]:
    """The images the arguments name, in order (see the module docstring), listed as the stream goes.

    An argument that names no image (an empty folder, a pattern matching nothing, an empty list, an
    unreadable shard; a shard of a pattern, each on its own) is, with ``inline``, a Source with its
    ``error`` in its place; else appended to ``problems`` as (argument, reason) when given; else
    raised as one ImageError."""

    def problem(name: str, reason: str) -> Iterator[Source]:
        if inline:
            yield Source(name, error=reason)
        elif problems is not None:
            problems.append((name, reason))
        else:
            raise ImageError(reason)

    for item in items:
        item = os.fspath(item)
        found = reported = 0
        try:
            for source in _item_sources(item):
                if source.error is not None:
                    reported += 1
                    yield from problem(source.name, source.error)
                    continue
                found += 1
                yield source
        except ImageError as err:
            reported += 1
            yield from problem(item, str(err))
        if not found and not reported:
            shown = printable(item, SHOWN_NAME)
            reason = f"{shown}: no images found (an empty folder or list, or a pattern that matches nothing)"
            yield from problem(item, reason)


def count_sources(items: Iterable[str]) -> int:
    """How many images :func:`iter_sources` will give (a listing pass: no image is read)."""
    return sum(1 for _ in iter_sources(items, problems=Problems(keep=0)))


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
    """The bytes of a source's file or shard member, None where they cannot be read or are no image's
    (not a regular file, over :data:`MAX_MEMBER_BYTES`): the reading route then says why. At most
    the size the file had when opened is read (a file growing meanwhile, /dev/zero: never more)."""
    try:
        if source.shard is None:
            with open_regular(source.name) as f:
                size = os.fstat(f.fileno()).st_size
                return f.read(size) if size <= MAX_MEMBER_BYTES else None
        if source.size > MAX_MEMBER_BYTES:
            return None
        with open(source.shard, "rb") as f:
            f.seek(source.offset)
            return f.read(source.size)
    except (OSError, ImageError):
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
            out.append(Loaded(source.name, error=error_line(source.name, str(err))))
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


class Sized(NamedTuple):
    """An image made ready for a model, with its own size: ``pixels`` (:func:`model_pixels`'
    arrays), ``size`` (W, H) of the image read (what a ``--focus`` box is in pixels of), and, for
    pictures, ``display``: the image shrunk to what a picture shows (None when not asked)."""

    pixels: tuple
    size: tuple[int, int]
    display: Any = None


def display_copy(image):
    """``image`` as the attention pictures show it: shrunk (bicubic) to viz/pictures.py's display
    size when that is smaller, so that a batch of 8000 x 8000 photos holds 640-pixel copies, not
    their full pixels; the pictures drawn from it are those drawn from the image."""
    from PIL import Image

    from captioning.viz.pictures import display_size

    shown = display_size(image.size)
    if shown[0] >= image.width and shown[1] >= image.height:
        return image
    return image.resize(shown, Image.Resampling.BICUBIC)


def sized_pixels(image, sizes: tuple[tuple[int, str], ...], display: bool = False) -> Sized:
    """An RGB image -> :class:`Sized`: the model's pixels (:func:`model_pixels`), its size and, with
    ``display``, its :func:`display_copy`: what ``caption --focus`` and ``attend`` keep of an image
    while its batch is captioned, whatever the image's size."""
    return Sized(model_pixels(image, sizes), image.size, display_copy(image) if display else None)


def sized_pixels_of(sizes, display: bool = False) -> Callable:
    """The picklable ``prepare`` of :func:`load_batches` that makes :class:`Sized` items."""
    import functools

    return functools.partial(sized_pixels, sizes=tuple((int(s), str(i)) for s, i in sizes), display=display)


def model_image(image, size: int, interpolation: str):
    """An RGB image resized to the model's ``size`` x ``size`` (the resize of data/images.py's
    ``to_pixels``), as an image: what the ONNX captioner reads (its own resize of it is a copy)."""
    from captioning.data.images import INTERPOLATIONS, check_interpolation

    return image.resize((size, size), INTERPOLATIONS[check_interpolation(interpolation)])


def model_image_of(size: int, interpolation: str) -> Callable:
    """The picklable ``prepare`` of :func:`load_batches` that makes :func:`model_image` items."""
    import functools

    return functools.partial(model_image, size=int(size), interpolation=str(interpolation))
