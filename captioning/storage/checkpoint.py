"""Checkpoints written by ``fit``, read safely into the one model description (:class:`ModelFile`).

A checkpoint describes itself: Lightning keeps the LightningModule's settings as plain values
("hyper_parameters"), and the module adds the vocabulary. :func:`read_checkpoint_file` reads it
with ``torch.load(weights_only=True)`` (a file that would run code when unpickled is refused) and
maps those settings to a :class:`~captioning.models.spec.ModelSpec`: ``encoder``, ``decoder``,
``image_size`` and ``test_generation`` (the model's default decoding), and the resize's
interpolation from the module's ``"preprocessing"`` entry (bilinear where a checkpoint written
before it was recorded has none). The settings of training
(:data:`TRAINING_KEYS`, :data:`RUN_KEYS`) are kept aside for the model card and config.json; any
other setting is one that this version does not know, and is refused.

A model folder (storage/folder.py) is read into the same :class:`ModelFile`; storage/load.py builds
the model from either. Nothing here imports Lightning or builds an objective or an optimizer.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from captioning.compat import CHECKPOINT_SPEC_KEYS
from captioning.errors import CaptioningError, CheckpointError
from captioning.files import safe_torch_load
from captioning.models.spec import ModelSpec
from captioning.storage.paper_names import to_paper_names
from captioning.vocab import Vocabulary

#: settings of how a model was trained that a checkpoint keeps besides its spec (config.json's "training")
TRAINING_KEYS = ("objective", "optimizer", "val_generation", "nonfinite_loss", "init_from")
#: settings of how the training step ran (speed only): read, not kept in a model folder
RUN_KEYS = ("static_shapes", "length_buckets", "cuda_graphs", "tf32")
#: a checkpoint's names of the spec's fields (the model's default decoding is the test split's)
SPEC_KEYS = CHECKPOINT_SPEC_KEYS


@dataclass(frozen=True)
class ModelSource:
    """Where a model came from: ``path`` as given (a file, a folder or a Hub id ``owner/name``),
    its ``kind`` and the ``local`` file or folder read (a Hub model's snapshot in the cache)."""

    path: str
    kind: Literal["checkpoint", "folder", "hub"]
    local: str


@dataclass
class ModelFile:
    """A model file of any format, read: what a captioner is built from.

    Attributes:
        spec: the model description.
        vocab: the vocabulary it writes in.
        weights: the model's tensors, named as ``ShowAttendTell.state_dict()`` names them.
        card: what a model card says: training_data, global_step, epoch, validation
            ({"monitor", "best"}), test_scores, ... and "training", the training settings
            (:data:`TRAINING_KEYS`: objective, optimizer, ...) where the file records them.
        source: where it came from.
        files: the files errors name: {"config": ..., "weights": ...}.
        training_state: a checkpoint's tensors that are not the model's (an objective's running
            state, e.g. a learned baseline); empty for a model folder.
        run: a checkpoint's :data:`RUN_KEYS` settings.
    """

    spec: ModelSpec
    vocab: Vocabulary
    weights: dict
    card: dict
    source: ModelSource
    files: dict
    training_state: dict = field(default_factory=dict)
    run: dict = field(default_factory=dict)

    def hyper_parameters(self) -> dict:
        """The settings in a checkpoint's form ("hyper_parameters": spec fields and training settings)."""
        plain = self.spec.to_dict()
        return {
            "encoder": plain["encoder"],
            "decoder": plain["decoder"],
            "image_size": plain["image_size"],
            "test_generation": plain["generation"],
            **(self.card.get("training") or {}),
            **self.run,
        }


def to_plain(value: Any) -> Any:
    """JSON types: tuples to lists, tensors to numbers, recursively."""
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def checkpoint_card(ckpt: dict) -> dict:
    """What a model card can say of a checkpoint: its training data, steps and best validation score
    (Lightning's ModelCheckpoint state)."""
    card: dict[str, Any] = {
        "training_data": ckpt.get("training_data"),
        "global_step": ckpt.get("global_step"),
        "epoch": ckpt.get("epoch"),
    }
    for key, state in (ckpt.get("callbacks") or {}).items():
        if (
            str(key).startswith("ModelCheckpoint")
            and isinstance(state, dict)
            and state.get("best_model_score") is not None
        ):
            card["validation"] = {"monitor": state.get("monitor"), "best": to_plain(state["best_model_score"])}
            break
    return to_plain(card)


def spec_from_hparams(hparams: dict, where: str) -> tuple[ModelSpec, dict, dict]:
    """(spec, training settings, run settings) of a checkpoint's hyperparameters; one line of
    :class:`CheckpointError` naming ``where`` for a setting this version does not know or cannot use."""
    from captioning.objectives import objective_class

    def misfit(problem) -> CheckpointError:
        return CheckpointError(f"{where}: hyperparameters do not fit this version of the model ({problem})")

    if not isinstance(hparams, dict):
        raise misfit(f"expected a mapping, got {type(hparams).__name__}")
    h = {k: v for k, v in hparams.items() if not str(k).startswith("_")}
    unknown = sorted(set(h) - set(SPEC_KEYS) - set(TRAINING_KEYS) - set(RUN_KEYS))
    if unknown:
        raise misfit(f"unknown setting(s) {', '.join(map(str, unknown))}")
    objective = h.get("objective")
    if objective is not None:  # a name only (nothing is built or imported): a checkpoint of a registered objective
        try:
            objective_class(objective.get("class_path", "") if isinstance(objective, dict) else objective)
        except CaptioningError as err:
            raise misfit(err) from None
    try:
        spec = ModelSpec.from_dict({SPEC_KEYS[k]: v for k, v in h.items() if k in SPEC_KEYS})
    except CaptioningError as err:
        raise misfit(err) from None
    return (spec, to_plain({k: h[k] for k in TRAINING_KEYS if k in h}), to_plain({k: h[k] for k in RUN_KEYS if k in h}))


def read_checkpoint_file(path: str, source: ModelSource | None = None) -> ModelFile:
    """A checkpoint file written by ``fit``, read (nothing that runs code) and checked."""
    path = os.fspath(path)
    ckpt = safe_torch_load(path, map_location="cpu")
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: not a captioning checkpoint (expected a dictionary)")
    for key in ("state_dict", "hyper_parameters", "vocabulary"):
        if key not in ckpt:
            raise CheckpointError(f"{path}: not a captioning checkpoint (no {key!r} inside)")
    spec, training, run = spec_from_hparams(ckpt["hyper_parameters"], path)
    preprocessing = ckpt.get("preprocessing")
    if preprocessing is not None and not isinstance(preprocessing, dict):
        raise CheckpointError(f"{path}: 'preprocessing' must be a mapping, got {type(preprocessing).__name__}")
    interpolation = (preprocessing or {}).get("interpolation")
    if interpolation is not None:
        if not isinstance(interpolation, str):
            raise CheckpointError(
                f"{path}: preprocessing.interpolation must be a string (a PIL filter's name), "
                f"got {type(interpolation).__name__} {interpolation!r:.40}"
            )
        try:
            spec = dataclasses.replace(spec, interpolation=interpolation)
        except CaptioningError as err:
            raise CheckpointError(f"{path}: hyperparameters do not fit this version of the model ({err})") from None
    try:
        vocab = Vocabulary.from_dict(ckpt["vocabulary"])
    except CaptioningError as err:
        raise CheckpointError(f"{path}: hyperparameters do not fit this version of the model ({err})") from None
    state = ckpt["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a captioning checkpoint ('state_dict' is not a mapping of tensors)")
    card = ckpt["card"] if isinstance(ckpt.get("card"), dict) else checkpoint_card(ckpt)
    return ModelFile(
        spec=spec,
        vocab=vocab,
        weights=to_paper_names(
            {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}, spec.decoder
        ),
        card={**card, **({"training": training} if training else {})},
        source=source or ModelSource(path, "checkpoint", path),
        files={"config": path, "weights": path},
        training_state={k: v for k, v in state.items() if not k.startswith("model.")},
        run=run,
    )


def state_mismatch(expected: dict, given: dict) -> str | None:
    """The first difference between the tensors a model needs and those given, in a few words; None if they fit."""
    missing, unexpected = [k for k in expected if k not in given], [k for k in given if k not in expected]
    for key, tensor in expected.items():
        if key in given and hasattr(given[key], "shape") and tuple(given[key].shape) != tuple(tensor.shape):
            return (
                f"{key} is {list(given[key].shape)} in the file, the model needs {list(tensor.shape)}; "
                f"{sum(1 for k in expected if k in given and tuple(given[k].shape) != tuple(expected[k].shape))} tensor(s) differ"
            )
    if missing:
        return f"{len(missing)} tensor(s) missing, e.g. {missing[0]}"
    if unexpected:
        return f"{len(unexpected)} unexpected tensor(s), e.g. {unexpected[0]}"
    return None


__all__ = [
    "ModelFile",
    "ModelSource",
    "read_checkpoint_file",
    "spec_from_hparams",
    "checkpoint_card",
    "state_mismatch",
    "to_plain",
    "TRAINING_KEYS",
    "RUN_KEYS",
]
