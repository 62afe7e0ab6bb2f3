"""Loading a trained captioner from its checkpoint, safely and with clear errors.

A checkpoint describes itself: the module's hyperparameters and the vocabulary are inside, so
nothing else is needed to rebuild the model. It is read with ``torch.load(weights_only=True)``:
a file that would run code when unpickled is refused.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from captioning.errors import CheckpointError
from captioning.io import safe_torch_load


def load_module(path: str, device: Optional[str] = None):
    """Rebuild a :class:`~captioning.module.CaptioningModule` in eval mode from a checkpoint file."""
    from captioning.module import CaptioningModule

    path = os.fspath(path)
    ckpt = safe_torch_load(path, map_location="cpu")
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: not a captioning checkpoint (expected a dictionary)")
    for key in ("state_dict", "hyper_parameters", "vocabulary"):
        if key not in ckpt:
            raise CheckpointError(f"{path}: not a captioning checkpoint (no {key!r} inside)")
    hparams = {k: v for k, v in ckpt["hyper_parameters"].items() if not k.startswith("_")}
    hparams["pretrained"] = False  # the weights come from the checkpoint: nothing to download
    hparams["encoder_weights"] = None
    try:
        module = CaptioningModule(**hparams, vocab=ckpt["vocabulary"])
    except TypeError as err:
        raise CheckpointError(f"{path}: hyperparameters do not fit this version of the model ({err})") from None
    try:
        module.load_state_dict(ckpt["state_dict"])
    except RuntimeError as err:
        detail = " ".join(str(err).split())[:200]
        raise CheckpointError(f"{path}: weights do not fit the architecture and vocabulary it describes ({detail})") from None
    module.eval()
    if device is not None:
        module.to(torch.device(device))
    return module
