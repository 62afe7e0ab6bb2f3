"""Tar headers read one at a time, each checked before the next is read: every reader of WebDataset
shards walks a shard with :func:`tar_members` (the training index, data/webdataset.py; the
streaming inputs of ``caption`` and ``attend``, data/inputs.py).

tarfile trusts a header. A size field can say anything (a base-256 field can be negative), and the
next header is read where this one says its member ends: a negative size makes ``TarFile.next``
return the same header for ever, a huge one reads past the file. A sparse member's stored bytes are
not its content, and a damaged PAX record raises ValueError. :func:`check_member` refuses such a
header in one line naming the shard and the member before the reader moves on. No torch here: the
streaming inputs read shards without it.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator

from captioning.errors import CaptioningError

#: the most bytes a text member (.txt, .json) may hold: it is read whole while indexing
MAX_TEXT_MEMBER = 64 << 20
#: the most bytes any other member (an image) may hold: it is read whole when its sample is read
MAX_IMAGE_MEMBER = 1 << 30
#: the members read as text
TEXT_EXTS = ("txt", "json")

#: what tarfile raises on a header it cannot parse (bad number fields, a PAX record of absurd
#: length or a sparse map that is no list of numbers, a cut file)
TAR_ERRORS = (tarfile.TarError, OSError, ValueError, OverflowError, EOFError, UnicodeError)


def member_limit(name: str) -> int:
    """The most bytes the member ``name`` may hold (by its extension: text or not)."""
    ext = name.rsplit(".", 1)[-1].lower() if "." in os.path.basename(name) else ""
    return MAX_TEXT_MEMBER if ext in TEXT_EXTS else MAX_IMAGE_MEMBER


def check_member(shard: str, info: tarfile.TarInfo, end: int, error: type[CaptioningError]) -> None:
    """A member's header, checked before its bytes are read or skipped (and before tarfile moves
    past them to the next header): its size is not negative and lies within the shard's ``end``
    bytes, a file's (or a member of a type tarfile reads as one) under :func:`member_limit`, and it
    is no sparse file (whose stored bytes are not its content). One line of ``error`` naming the
    shard and member otherwise."""
    where = f"{shard}: member {info.name!r:.200}"
    if info.issparse():
        raise error(f"{where}: a sparse file (its stored bytes are not its content); write shards of plain files")
    if info.size < 0 or info.offset_data + info.size > end:
        raise error(
            f"{where}: its header declares {info.size:,} bytes, past the end of the shard "
            f"({end:,} bytes): a damaged or forged tar header"
        )
    limit = member_limit(info.name)
    if (info.isfile() or info.type not in tarfile.SUPPORTED_TYPES) and info.size > limit:
        raise error(f"{where}: {info.size:,} bytes, more than the {limit:,} a member of its kind may hold")


def tar_members(shard: str, error: type[CaptioningError]) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    """(header, open tar) of each regular member of ``shard``, in file order, each header checked by
    :func:`check_member` before the next is read (folders and links have no bytes of their own and
    are passed over); the headers are not kept (a shard of millions of members reads in constant
    memory). A shard that is not a readable tar file, or a damaged header, is one line of
    ``error`` naming the shard, raised after the members before it were given."""
    try:
        end = os.path.getsize(shard)
        tar = tarfile.open(shard, "r:")
    except TAR_ERRORS as err:
        raise error(f"{shard}: not a readable tar file ({' '.join(str(err).split())[:160]})") from None
    with tar:
        while True:
            try:
                info = tar.next()
            except TAR_ERRORS as err:
                raise error(f"{shard}: damaged tar file ({' '.join(str(err).split())[:160]})") from None
            tar.members.clear()  # streamed: TarFile would keep every header read
            if info is None:
                return
            check_member(shard, info, end, error)  # before tar.next() moves by its size
            if info.isfile():
                yield info, tar
