"""The training module of a checkpoint, for tests and tools that look at training (an objective's
settings and running state). Captioning needs the model only: storage/load.py's ``load_model``."""

from __future__ import annotations

import os

import torch

from captioning.decoding.generation import GenerationConfig
from captioning.errors import CaptioningError, CheckpointError
from captioning.objectives import objective_from_spec
from captioning.storage.checkpoint import state_mismatch
from captioning.storage.load import model_of, read_model_file
from captioning.training.module import CaptioningModule
from captioning.training.optim import OptimizerConfig


def load_module(path: str | os.PathLike, device: str | None = None) -> CaptioningModule:
    """The :class:`CaptioningModule` of a checkpoint or model folder, in eval mode: the model
    ``load_model`` gives (with its ``source`` and ``card``), the objective rebuilt with the recorded
    settings (the default of the attention kind where a folder records none) and a checkpoint's
    running state."""
    file = read_model_file(path)
    model = model_of(file)
    h = file.hyper_parameters()
    try:
        module = CaptioningModule(
            encoder=model.spec.encoder,
            decoder=model.spec.decoder,
            test_generation=model.spec.generation,
            image_size=model.spec.image_size,
            objective=objective_from_spec(h["objective"]) if "objective" in h else None,
            optimizer=OptimizerConfig(**h.get("optimizer", {})),
            **({"val_generation": GenerationConfig(**h["val_generation"])} if h.get("val_generation") else {}),
            **({"length_buckets": tuple(h["length_buckets"])} if "length_buckets" in h else {}),
            **{k: h[k] for k in ("nonfinite_loss", "init_from", "static_shapes", "cuda_graphs", "tf32") if k in h},
        )
    except (TypeError, CaptioningError) as err:
        raise CheckpointError(
            f"{file.files['config']}: hyperparameters do not fit this version of the model ({err})"
        ) from None
    module.model = model
    checkpoint = file.source.kind == "checkpoint"  # a folder holds the model's weights only
    optional = {f"objective.{k}" for k in module.objective.optional_state}
    expected = {k: v for k, v in module.state_dict().items() if k.startswith("objective.") and k not in optional}
    mismatch = (
        state_mismatch(expected, {k: v for k, v in file.training_state.items() if k not in optional})
        if checkpoint
        else None
    )
    if mismatch:
        raise CheckpointError(
            f"{file.files['weights']}: weights do not fit the architecture and vocabulary it describes ({mismatch})"
        )
    module.load_state_dict(
        {**{f"model.{k}": v for k, v in model.state_dict().items()}, **file.training_state}, strict=checkpoint
    )
    module.eval()
    return module if device is None else module.to(torch.device(device))
