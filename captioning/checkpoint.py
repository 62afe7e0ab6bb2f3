"""Loading a trained captioner from its checkpoint, safely and with clear errors.

A checkpoint describes itself: the module's hyperparameters and the vocabulary are inside, so
nothing else is needed to rebuild the model. It is read with ``torch.load(weights_only=True)``:
a file that would run code when unpickled is refused.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from captioning.errors import CaptioningError, CheckpointError
from captioning.files import safe_torch_load


def module_from_hparams(hparams: dict):
    """A CaptioningModule (no model yet: see set_vocab) from the plain values a checkpoint keeps."""
    from captioning.models.decoder import DecoderConfig
    from captioning.models.encoders import EncoderConfig
    from captioning.models.search import GenerationConfig
    from captioning.module import CaptioningModule
    from captioning.optim import OptimizerConfig
    from captioning.objectives import objective_from_spec

    h = {k: v for k, v in hparams.items() if not k.startswith("_")}
    unknown = set(h) - {"encoder", "decoder", "objective", "optimizer", "val_generation", "test_generation",
                        "nonfinite_loss", "image_size", "init_from"}  # init_from: provenance only, not reloaded
    if unknown:
        raise TypeError(f"unknown setting(s) {', '.join(sorted(unknown))}")
    # the weights come from the checkpoint: nothing to download
    encoder = dict(h["encoder"], pretrained=False, weights=None)
    return CaptioningModule(
        encoder=EncoderConfig(**encoder), decoder=DecoderConfig(**h["decoder"]),
        objective=objective_from_spec(h["objective"]), optimizer=OptimizerConfig(**h["optimizer"]),
        val_generation=GenerationConfig(**h["val_generation"]), test_generation=GenerationConfig(**h["test_generation"]),
        nonfinite_loss=h["nonfinite_loss"], image_size=h["image_size"],
    )


def load_module(path: str, device: Optional[str] = None):
    """Rebuild a :class:`~captioning.module.CaptioningModule` in eval mode from a checkpoint file."""
    from captioning.vocab import Vocabulary

    path = os.fspath(path)
    ckpt = safe_torch_load(path, map_location="cpu")
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: not a captioning checkpoint (expected a dictionary)")
    for key in ("state_dict", "hyper_parameters", "vocabulary"):
        if key not in ckpt:
            raise CheckpointError(f"{path}: not a captioning checkpoint (no {key!r} inside)")
    try:
        module = module_from_hparams(ckpt["hyper_parameters"])
        module.set_vocab(Vocabulary.from_dict(ckpt["vocabulary"]))
    except (TypeError, KeyError, CaptioningError) as err:
        raise CheckpointError(f"{path}: hyperparameters do not fit this version of the model ({err})") from None
    try:
        module.load_state_dict(ckpt["state_dict"])
    except RuntimeError as err:
        detail = " ".join(str(err).split())[:200]
        raise CheckpointError(f"{path}: weights do not fit the architecture and vocabulary it describes ({detail})") from None
    module.training_data = ckpt.get("training_data")
    module.eval()
    if device is not None:
        module.to(torch.device(device))
    return module
