"""``model.init_from``: the trained model a run starts from (e.g. cross-entropy weights before SCST),
checked against the run's config and data in one line each."""

from __future__ import annotations

import os

from captioning.errors import CheckpointError, ConfigError
from captioning.models.show_attend_tell import ShowAttendTell
from captioning.models.spec import ModelSpec
from captioning.vocab import Vocabulary


def initial_model(path: str, spec: ModelSpec) -> ShowAttendTell:
    """The model of the checkpoint, model folder or Hub id ``path`` (storage/load.py: load_model);
    one line of :class:`CheckpointError` if it is none, or not a model of ``spec``'s architecture
    (the settings its weights' meaning depends on: ModelSpec.architecture)."""
    from captioning.storage.hub import looks_like_hub_id
    from captioning.storage.load import load_model

    if not os.path.exists(path) and not looks_like_hub_id(path):
        raise CheckpointError(f"model.init_from={path}: no such file")
    try:
        model = load_model(path)
    except CheckpointError as err:
        raise CheckpointError(f"model.init_from={path}: not a captioning checkpoint ({err})") from None
    differences = spec.architecture_differences(model.spec)
    if differences:
        raise CheckpointError(
            f"model.init_from={path}: another architecture ({'; '.join(differences)}); "
            "start from a checkpoint of this config's model, or make the config match it"
        )
    return model


def check_vocabulary(path: str, theirs: Vocabulary, data: Vocabulary) -> None:
    """A one-line ConfigError unless the vocabulary of the model at ``path`` is the data's."""
    if theirs != data:
        raise ConfigError(
            f"model.init_from={path}: its vocabulary ({len(theirs)} words) is not the "
            f"data's ({len(data)} words); train on the data it was trained on, with the same "
            "data.min_word_freq / data.vocabulary"
        )


def start_from(module, path: str, datamodule, stage: str) -> None:
    """Build ``module``'s model (a CaptioningModule without one) with the weights and vocabulary of
    the model at ``path``, after checking its architecture against the module's spec and its
    vocabulary against the data's."""
    start = initial_model(path, module.spec)
    datamodule.setup(stage)  # the data's own vocabulary, to compare
    check_vocabulary(path, start.vocab, datamodule.vocab)
    module.set_vocab(start.vocab)
    module.model.load_state_dict(start.state_dict())
