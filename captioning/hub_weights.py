"""Backbones published on the Hugging Face Hub, or a local copy of one: their files, safetensors only.

timm and OpenCLIP name such a backbone ``hf-hub:owner/name[@revision]``; a folder holding the same
files is ``local-dir:PATH``. The encoders (``timm:hf-hub:...``, ``open_clip:hf-hub:...``) and CLIPScore
read its configuration (JSON) and its safetensors weights through here: a repository or folder
whose weights are only a pickle (``pytorch_model.bin``, which can run code when read) is refused in
one line, before anything is read. Files come through huggingface_hub's cache (its token, and
``HF_HUB_OFFLINE=1`` for the cache alone), so a backbone fetched once, or copied into the cache or a
folder, loads offline.
"""

from __future__ import annotations

import os
import re

from captioning.errors import ConfigError

SOURCES = ("hf-hub:", "local-dir:")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
#: the pickle files of each library's weights, named in the refusal
PICKLES = ("pytorch_model.bin", "open_clip_pytorch_model.bin", "model.pth", "pytorch_model.pth")


def is_hosted(model: str) -> bool:
    """Whether ``model`` names a Hub repository or a local folder (``hf-hub:`` / ``local-dir:``)."""
    return model.startswith(SOURCES)


def check_hosted_name(label: str, model: str) -> None:
    """A one-line ConfigError, starting with ``label``, unless ``model`` is ``hf-hub:owner/name[@revision]``
    or ``local-dir:PATH`` (the syntax only: nothing is fetched)."""
    if model.startswith("hf-hub:"):
        repo, _, revision = model[len("hf-hub:") :].partition("@")
        if not _REPO.fullmatch(repo) or "@" in model[len("hf-hub:") :] and not revision:
            raise ConfigError(f"{label}: expected hf-hub:owner/name or hf-hub:owner/name@revision, got {model!r}")
    elif model.startswith("local-dir:") and not model[len("local-dir:") :]:
        raise ConfigError(f"{label}: expected local-dir:PATH, a folder with the backbone's files")


def hosted_file(label: str, model: str, filename: str, token: str | bool | None = None) -> str:
    """The local path of ``filename`` of the backbone ``model`` (fetched into, or found in, huggingface_hub's
    cache; offline with ``HF_HUB_OFFLINE``); a one-line ConfigError naming ``label`` when it is not there."""
    if model.startswith("local-dir:"):
        folder = model[len("local-dir:") :]
        path = os.path.join(folder, filename)
        if not os.path.isfile(path):
            raise ConfigError(f"{label}: {path}: no such file (a local-dir: folder holds the backbone's files)")
        return path
    repo, _, revision = model[len("hf-hub:") :].partition("@")
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise ConfigError(f"{label}: needs huggingface_hub (pip install huggingface_hub)") from None
    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        return hf_hub_download(repo, filename, revision=revision or None, token=token, local_files_only=offline)
    except RepositoryNotFoundError:
        raise ConfigError(
            f"{label}: no repository {repo} on the Hugging Face Hub (or it is private: `hf auth login`, or HF_TOKEN)"
        ) from None
    except LocalEntryNotFoundError:
        where = constants.HF_HUB_CACHE
        if offline:
            raise ConfigError(
                f"{label}: {filename} of {repo} is not in the Hugging Face cache ({where}) and HF_HUB_OFFLINE is "
                "set: fetch it once with network access, or name a local copy as local-dir:PATH"
            ) from None
        raise ConfigError(
            f"{label}: could not reach the Hugging Face Hub for {repo}'s {filename}, and it is not in the cache ({where})"
        ) from None
    except EntryNotFoundError:  # (after LocalEntryNotFoundError, its subclass in some releases)
        raise ConfigError(f"{label}: the repository {repo} has no {filename}") from None
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{label}: could not fetch {repo}'s {filename} ({' '.join(str(err).split())[:150]})"
        ) from None


def _cached_pickle(model: str) -> str | None:
    """A pickle of the backbone ``model`` found without fetching anything (its folder, or the cache)."""
    if model.startswith("local-dir:"):
        folder = model[len("local-dir:") :]
        found = [n for n in PICKLES if os.path.isfile(os.path.join(folder, n))]
        return found[0] if found else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    repo, _, revision = model[len("hf-hub:") :].partition("@")
    for name in PICKLES:
        if isinstance(try_to_load_from_cache(repo, name, revision=revision or None), str):
            return name
    return None


def hosted_weights(
    label: str,
    model: str,
    filename: str,
    token: str | bool | None = None,
    instead: str = "--model.encoder.weights PATH (a safetensors file), or --model.encoder.pretrained false",
) -> str:
    """The local path of the backbone's safetensors weights ``filename``. Without them a one-line
    ConfigError: a pickle is refused (never read), saying what to do ``instead``."""
    try:
        return hosted_file(label, model, filename, token)
    except ConfigError as err:
        pickle = _cached_pickle(model)
        if pickle is not None:
            raise ConfigError(
                f"{label}: its weights are {pickle}, a pickle, which can run code when read: refused (only "
                f"safetensors weights, {filename}, are loaded); convert them to safetensors, or pass {instead}"
            ) from None
        if f"has no {filename}" in str(err):  # a repository with other weights: a pickle, most often
            raise ConfigError(
                f"{label}: the repository has no {filename}, and only safetensors weights are loaded (a pickle "
                f"such as pytorch_model.bin can run code when read: refused); pass {instead}"
            ) from None
        raise
