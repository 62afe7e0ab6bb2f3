"""Model folders on the Hugging Face Hub: which names are Hub ids, and their local snapshot.

A name is a Hub id when it says so, ``hf://owner/name[@revision]``, or when it is ``owner/name[@revision]``
and cannot be a path here: nothing exists at that path, no folder ``owner`` exists here (a mistyped
local folder ``runs/best`` is a missing path, never a download), it has no file suffix and no ``.``
/ ``..`` / ``~`` part. ``@revision`` (a branch, tag or commit) pins the snapshot. Only the files of a
model folder are fetched (config.json, vocab.json, the weights or ONNX graphs, the model card),
never the rest of a repository.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from captioning.errors import CheckpointError

PREFIX = "hf://"

#: file name endings that make ``a/b.ckpt`` a path, never a Hub id
_FILE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".safetensors", ".onnx", ".json")

#: what a model folder holds (storage/layout.py): the only files fetched from a repository
ALLOW_PATTERNS = ["config.json", "vocab.json", "model.safetensors", "README.md", "*.onnx"]

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_HUB_ID = re.compile(rf"({_PART}/{_PART})(?:@([A-Za-z0-9][A-Za-z0-9._/-]*))?")


class HubId(NamedTuple):
    repo_id: str  # owner/name
    revision: str | None  # a branch, tag or commit; None: the default branch


def parse_hub_id(name: str) -> HubId | None:
    """The Hub id ``name`` stands for (see the module docstring), or None when it is a path."""
    explicit = name.startswith(PREFIX)
    body = name[len(PREFIX) :] if explicit else name
    match = _HUB_ID.fullmatch(body)
    if match is None:
        if explicit:
            raise CheckpointError(f"{name}: not a Hub id (expected {PREFIX}owner/name or {PREFIX}owner/name@revision)")
        return None
    repo_id, revision = match.group(1), match.group(2)
    if not explicit:
        owner = repo_id.split("/")[0]
        if (
            os.sep != "/"
            or os.path.exists(name)
            or os.path.exists(owner)
            or name.startswith((".", "~"))
            or repo_id.lower().endswith(_FILE_SUFFIXES)
            or any(p in (".", "..") for p in repo_id.split("/"))
        ):
            return None
    return HubId(repo_id, revision)


def looks_like_hub_id(name: str) -> bool:
    """Whether ``name`` is read as a Hub id (see the module docstring)."""
    return parse_hub_id(os.fspath(name)) is not None


def resolve_folder(
    name_or_path: str,
    revision: str | None = None,
    local_files_only: bool | None = None,
    cache_dir: str | None = None,
    token: str | bool | None = None,
) -> str:
    """The local folder of a model: ``name_or_path`` itself if it is a path, else the snapshot of the
    Hub repository it names (the model folder's files only), downloaded into or found in
    huggingface_hub's cache. ``revision`` pins it (an ``@revision`` in the name does too; both at
    once must agree).

    ``local_files_only``: the cache only (default: true when ``HF_HUB_OFFLINE`` is set). A model
    that is not in the cache then is a one-line error saying so. ``token``: huggingface_hub's, for a
    private or gated repository (default: the one ``hf auth login`` stored, or ``HF_TOKEN``).
    """
    name = os.fspath(name_or_path)
    hub = parse_hub_id(name)
    if hub is None:
        return name  # a path, whose problem the reader names
    if hub.revision and revision and hub.revision != revision:
        raise CheckpointError(f"{name}: names revision {hub.revision!r}, but revision {revision!r} was asked for")
    repo_id, revision = hub.repo_id, hub.revision or revision
    try:
        import huggingface_hub
        from huggingface_hub.utils import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    except ImportError:
        raise CheckpointError(
            f"{name}: no such folder here, and huggingface_hub (pip install huggingface_hub) is "
            "needed to fetch it from the Hugging Face Hub"
        ) from None
    from huggingface_hub import constants

    offline = bool(constants.HF_HUB_OFFLINE) if local_files_only is None else bool(local_files_only)
    here = "" if name.startswith(PREFIX) else "no such file or folder here, and "
    try:
        return huggingface_hub.snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=offline,
            allow_patterns=ALLOW_PATTERNS,
            library_name="captioning",
            token=token,
        )
    except LocalEntryNotFoundError:
        where = cache_dir or constants.HF_HUB_CACHE
        if offline:
            raise CheckpointError(
                f"{name}: {here}not in the Hugging Face cache ({where}) and offline (HF_HUB_OFFLINE or "
                "local_files_only): download it once with network access, or give a local folder"
            ) from None
        raise CheckpointError(
            f"{name}: {here}could not reach the Hugging Face Hub and it is not in the cache ({where}); "
            "check the network, or give a local folder"
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{name}: no such folder here and no such model on the Hugging Face Hub "
            "(or it is private: log in with `hf auth login`, or pass a token)"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{name}: no revision {revision!r} on the Hugging Face Hub") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{name}: could not fetch from the Hugging Face Hub ({' '.join(str(err).split())[:150]})"
        ) from None
