"""One loader: a checkpoint file, a model folder or a Hugging Face Hub id -> a ShowAttendTell in eval mode.

    from captioning.storage.load import load_model
    model = load_model("best.ckpt")            # or "model_folder", or "owner/name"
    model.spec      # ModelSpec: encoder, decoder, image_size, generation (the default decoding)
    model.source    # ModelSource: path as given, kind "checkpoint" | "folder" | "hub", the local file or folder
    model.card      # what a model card says: training_data, global_step, epoch, validation, test_scores, training

One reader per format (storage/checkpoint.py: ``fit``'s checkpoints, read with
``torch.load(weights_only=True)``; storage/folder.py: safetensors + config.json) gives one
:class:`~captioning.storage.checkpoint.ModelFile`; :func:`load_model` builds the model of its spec
(:func:`~captioning.models.spec.build_model`), checks that the weights fit and loads them. No
Lightning, no objective, no optimizer: the training code is not imported.
"""

from __future__ import annotations

import os

import torch

from captioning.common import PathLike
from captioning.errors import CaptioningError, CheckpointError
from captioning.models.show_attend_tell import ShowAttendTell
from captioning.models.spec import build_model
from captioning.plugins import load_plugins
from captioning.storage.checkpoint import ModelFile, ModelSource, read_checkpoint_file, state_mismatch
from captioning.storage.folder import read_folder
from captioning.storage.hub import looks_like_hub_id, resolve_folder


def read_model_file(
    path: PathLike,
    revision: str | None = None,
    local_files_only: bool | None = None,
    cache_dir: str | None = None,
    token: str | bool | None = None,
) -> ModelFile:
    """The :class:`ModelFile` of a checkpoint file, a model folder or a Hub id ``owner/name`` (fetched
    into, or found in, huggingface_hub's cache; the other arguments are for it: see
    :func:`~captioning.storage.hub.resolve_folder`)."""
    load_plugins()  # the file may name a plugin's attention score, decoder kind or encoder
    path = os.fspath(path)
    if looks_like_hub_id(path):
        local = resolve_folder(
            path, revision=revision, local_files_only=local_files_only, cache_dir=cache_dir, token=token
        )
        return read_folder(local, ModelSource(path, "hub", local))
    if os.path.isdir(path):
        return read_folder(path)
    return read_checkpoint_file(path)


def model_of(file: ModelFile) -> ShowAttendTell:
    """The model a :class:`ModelFile` describes, with its weights, in eval mode on the CPU; ``spec``,
    ``source`` and ``card`` set. The weights must fit exactly (one line naming the file if not)."""
    spec = file.spec.without_pretrained()  # the weights come from the file: nothing to download
    what = "config.json" if file.source.kind != "checkpoint" else "the architecture and vocabulary it describes"
    try:  # the shapes first, on the meta device (no memory): sizes the file's tensors do not match are never allocated
        with torch.device("meta"):
            shapes = build_model(spec, file.vocab).state_dict()
    except CaptioningError:  # a library's backbone that cannot be built on the meta device (OpenCLIP): checked below
        shapes = None
    except (TypeError, ValueError, OverflowError, RuntimeError) as err:  # e.g. a size past what torch can hold
        detail = " ".join(str(err).split("\n")[0].split())[:150]
        raise CheckpointError(f"{file.files['config']}: its settings do not make a model ({detail})") from None
    model = build_model(spec, file.vocab) if shapes is None else None
    mismatch = state_mismatch(shapes if shapes is not None else model.state_dict(), file.weights)
    if mismatch:
        raise CheckpointError(f"{file.files['weights']}: weights do not fit {what} ({mismatch})")
    model = model if model is not None else build_model(spec, file.vocab)
    try:
        model.load_state_dict(file.weights)
    except RuntimeError as err:
        detail = " ".join(str(err).split())[:200]
        raise CheckpointError(f"{file.files['weights']}: weights do not fit {what} ({detail})") from None
    model.source, model.card = file.source, file.card
    return model.eval()


def load_model(
    path: PathLike,
    device: str | torch.device | None = None,
    revision: str | None = None,
    local_files_only: bool | None = None,
    cache_dir: str | None = None,
    token: str | bool | None = None,
) -> ShowAttendTell:
    """The captioner of a checkpoint file (``captioning fit``'s), a model folder (``captioning export``'s)
    or a Hugging Face Hub model ``owner/name``, in eval mode on ``device`` (default: the CPU).

    The model carries ``model.spec`` (:class:`~captioning.models.spec.ModelSpec`), ``model.source``
    (:class:`~captioning.storage.checkpoint.ModelSource`) and ``model.card`` (a dict: training_data,
    global_step, epoch, validation, test_scores and the training settings "training", as far as the
    file records them). Hub arguments: see :func:`~captioning.storage.hub.resolve_folder`.
    Every problem with the file is one line of :class:`~captioning.errors.CheckpointError` naming it.
    """
    file = read_model_file(path, revision=revision, local_files_only=local_files_only, cache_dir=cache_dir, token=token)
    model = model_of(file)
    return model if device is None else model.to(torch.device(device))


__all__ = ["load_model", "read_model_file", "model_of"]
