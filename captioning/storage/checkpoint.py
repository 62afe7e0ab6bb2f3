"""Loading a trained captioner from its checkpoint or model folder, safely and with clear errors.

A checkpoint describes itself: the module's hyperparameters and the vocabulary are inside, so
nothing else is needed to rebuild the model. It is read with ``torch.load(weights_only=True)``:
a file that would run code when unpickled is refused. A model folder (``captioning export``:
model.safetensors, config.json, vocab.json; see model_folder.py) is read into the same
dictionary, so :func:`load_module` -- the loader of every command -- takes either.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from captioning.errors import CaptioningError, CheckpointError
from captioning.storage.folder import checkpoint_card, read_checkpoint


def module_from_hparams(hparams: dict):
    """A CaptioningModule (no model yet: see set_vocab) from the plain values a checkpoint keeps."""
    from captioning.models.decoder import DecoderConfig
    from captioning.models.encoders import EncoderConfig
    from captioning.decoding.search import GenerationConfig
    from captioning.training.module import CaptioningModule
    from captioning.training.optim import OptimizerConfig
    from captioning.objectives import objective_from_spec

    h = {k: v for k, v in hparams.items() if not k.startswith("_")}
    unknown = set(h) - {"encoder", "decoder", "objective", "optimizer", "val_generation", "test_generation",
                        "nonfinite_loss", "image_size", "init_from",  # init_from: provenance only, not reloaded
                        "static_shapes", "length_buckets", "cuda_graphs", "tf32"}  # how it trained
    if unknown:
        raise TypeError(f"unknown setting(s) {', '.join(sorted(unknown))}")
    # the weights come from the checkpoint: nothing to download
    encoder = dict(h["encoder"], pretrained=False, weights=None)
    return CaptioningModule(
        encoder=EncoderConfig(**encoder), decoder=DecoderConfig(**h["decoder"]),
        objective=objective_from_spec(h["objective"]), optimizer=OptimizerConfig(**h["optimizer"]),
        val_generation=GenerationConfig(**h["val_generation"]), test_generation=GenerationConfig(**h["test_generation"]),
        nonfinite_loss=h["nonfinite_loss"], image_size=h["image_size"],
        **{k: h[k] for k in ("static_shapes", "cuda_graphs", "tf32") if k in h},
        **({"length_buckets": tuple(h["length_buckets"])} if "length_buckets" in h else {}),
    )


def state_mismatch(expected: dict, given: dict) -> Optional[str]:
    """The first difference between the tensors a model needs and those given, in a few words; None if they fit."""
    missing, unexpected = [k for k in expected if k not in given], [k for k in given if k not in expected]
    for key, tensor in expected.items():
        if key in given and hasattr(given[key], "shape") and tuple(given[key].shape) != tuple(tensor.shape):
            return (f"{key} is {list(given[key].shape)} in the file, the model needs {list(tensor.shape)}; "
                    f"{sum(1 for k in expected if k in given and tuple(given[k].shape) != tuple(expected[k].shape))} tensor(s) differ")
    if missing:
        return f"{len(missing)} tensor(s) missing, e.g. {missing[0]}"
    if unexpected:
        return f"{len(unexpected)} unexpected tensor(s), e.g. {unexpected[0]}"
    return None


def load_module(path: str, device: Optional[str] = None, ckpt: Optional[dict] = None):
    """Rebuild a :class:`~captioning.training.module.CaptioningModule` in eval mode from a checkpoint file
    or a model folder (``ckpt``: its :func:`read_checkpoint` dictionary, if already read)."""
    from captioning.vocab import Vocabulary

    path = os.fspath(path)
    ckpt = read_checkpoint(path) if ckpt is None else ckpt
    files = ckpt.get("_files") or {}  # a model folder: errors name its config.json / model.safetensors
    try:
        module = module_from_hparams(ckpt["hyper_parameters"])
        module.set_vocab(Vocabulary.from_dict(ckpt["vocabulary"]))
    except (TypeError, KeyError, CaptioningError) as err:
        raise CheckpointError(f"{files.get('config', path)}: hyperparameters do not fit this version of the model ({err})") from None
    what = "config.json" if files else "the architecture and vocabulary it describes"
    expected = module.state_dict()
    if files:  # a folder holds the model's weights only, not the objective's running state (e.g. a baseline)
        expected = {k: v for k, v in expected.items() if k.startswith("model.")}
    # running state an objective sizes or fills in itself when loading (e.g. a lazily sized learned baseline)
    optional = {f"objective.{k}" for k in getattr(module.objective, "optional_state", ())}
    expected = {k: v for k, v in expected.items() if k not in optional}
    mismatch = state_mismatch(expected, {k: v for k, v in ckpt["state_dict"].items() if k not in optional})
    if mismatch:
        raise CheckpointError(f"{files.get('weights', path)}: weights do not fit {what} ({mismatch})")
    try:
        module.load_state_dict(ckpt["state_dict"], strict=not files)
    except RuntimeError as err:
        detail = " ".join(str(err).split())[:200]
        raise CheckpointError(f"{files.get('weights', path)}: weights do not fit {what} ({detail})") from None
    module.training_data = ckpt.get("training_data")
    module.card = ckpt["card"] if isinstance(ckpt.get("card"), dict) else checkpoint_card(ckpt)  # for model cards
    module.eval()
    if device is not None:
        module.to(torch.device(device))
    return module
