"""Resuming a run: what its checkpoint records about the run, the checks made before anything is
restored, and ``--ckpt_path last``.

A resumed run continues exactly (the same batches, random draws and weights as the uninterrupted
run) only if the settings below are those of the run that wrote the checkpoint. The checkpoint
records them (``checkpoint["continuation"]``); :func:`check_checkpoint` refuses a resume that
changes one with one line naming the setting and both values, and a checkpoint whose weights do
not fit the model with one line naming the tensor, before Lightning loads anything.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import torch

from captioning.errors import CheckpointError, ConfigError
from captioning.storage.checkpoint import state_mismatch
from captioning.storage.paper_names import is_fused, to_paper_names

#: the settings a run's continuation depends on, and the option that sets each
SETTINGS = {
    "batch_size": "data.batch_size",
    "group_captions": "data.group_captions",
    "bucket_by_length": "data.bucket_by_length",
    "image_size": "data.image_size",
    "world_size": "the number of processes (trainer.devices x trainer.num_nodes)",
    "seed": "seed_everything",
    "architecture": "model (architecture)",
}


def run_seed(trainer) -> int:
    """The run's seed: the one its steps are seeded from (guards.py: StepSeeding reads it when the
    fit starts, before any step reseeds the generator), or before that ``torch.initial_seed()``,
    which is then still ``seed_everything``'s."""
    from captioning.training.guards import StepSeeding

    seeds = [c.run_seed for c in trainer.callbacks if isinstance(c, StepSeeding) and c.run_seed is not None]
    return int(seeds[0]) if seeds else int(torch.initial_seed())


def continuation(trainer, module) -> dict[str, Any]:
    """The settings of :data:`SETTINGS` in this run (plain values, for the checkpoint)."""
    dm = trainer.datamodule
    return {
        "batch_size": getattr(dm, "batch_size", None),
        "group_captions": getattr(dm, "group_captions", None),
        "bucket_by_length": getattr(dm, "bucket_by_length", None),
        "image_size": module.image_size,
        "world_size": trainer.world_size,
        "seed": run_seed(trainer),
        "architecture": module.spec.architecture(),
    }


def checkpoint_extras(module) -> dict[str, Any]:
    """What a CaptioningModule adds to each of its checkpoints besides Lightning's state: the
    vocabulary, the run's :func:`continuation` settings, the training data and the resize (read back
    into the model's description by storage/checkpoint.py) and the objective's own state where it
    keeps one (``Objective.checkpoint_state``, e.g. SCST's CIDEr-D document frequencies)."""
    trainer = module.trainer
    extras = {
        "vocabulary": module.vocab.to_dict(),
        "continuation": continuation(trainer, module),
        "training_data": str(getattr(trainer.datamodule, "annotations", "")) or None,
        "preprocessing": {"interpolation": module.model.spec.interpolation},
    }
    objective_state = module.objective.checkpoint_state()
    return {**extras, **({"objective_state": objective_state} if objective_state else {})}


def _architecture_difference(saved: dict, here: dict) -> str:
    """``decoder.hidden_dim is 256 in the checkpoint, 512 here`` for the first setting that differs."""
    for part in sorted(set(saved) | set(here)):
        a, b = saved.get(part), here.get(part)
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    return f"model: {part}.{key} is {a.get(key)!r} in the checkpoint, {b.get(key)!r} here"
        elif a != b:
            return f"model: {part} is {a!r} in the checkpoint, {b!r} here"
    return "model: another architecture"


def continuation_difference(saved: dict, here: dict) -> str | None:
    """One line naming the first setting of :data:`SETTINGS` that differs (None if none does).
    A setting the checkpoint does not record (an earlier version's) is not compared."""
    for key, option in SETTINGS.items():
        if key not in saved or saved[key] is None or here.get(key) is None or saved[key] == here[key]:
            continue
        if key == "architecture":
            return _architecture_difference(saved[key], here[key])
        hint = f" (give --seed_everything {saved[key]})" if key == "seed" else ""
        return f"{option} is {saved[key]!r} in the checkpoint, {here[key]!r} here{hint}"
    return None


def check_checkpoint(module, checkpoint: dict) -> None:
    """Before Lightning restores ``checkpoint`` into ``module`` (whose model is built): a
    :class:`CheckpointError` of one line if its weights do not fit the model (naming the tensor),
    or, when fitting, a :class:`ConfigError` if the run's settings break exact continuation."""
    trainer = module._trainer
    path = getattr(trainer, "ckpt_path", None) or "the checkpoint"
    if "continuation" in checkpoint and trainer is not None and trainer.state.fn == "fit":
        difference = continuation_difference(checkpoint["continuation"], continuation(trainer, module))
        if difference:
            raise ConfigError(
                f"{path}: cannot resume exactly: {difference}; resume with the checkpoint's settings, "
                "or start a new run from its weights with model.init_from"
            )
    weights = checkpoint.get("state_dict")
    model_weights = (
        {k[len("model.") :]: v for k, v in weights.items() if k.startswith("model.")}
        if isinstance(weights, dict)
        else {}
    )
    if is_fused(model_weights):  # an earlier version's LSTM decoder: its weights in the paper's names
        if trainer is not None and trainer.state.fn == "fit":
            raise CheckpointError(
                f"{path}: written by an earlier version (its decoder's parameters fused): a run cannot be "
                f"resumed from it; start a new run from its weights with --model.init_from {path}"
            )
        converted = to_paper_names(model_weights, module.spec.decoder)
        weights = {
            **{k: v for k, v in weights.items() if not k.startswith("model.")},
            **{f"model.{k}": v for k, v in converted.items()},
        }
        checkpoint["state_dict"] = weights
    if isinstance(weights, dict):
        optional = {f"objective.{k}" for k in module.objective.optional_state}
        expected = {k: v for k, v in module.state_dict().items() if k not in optional}
        mismatch = state_mismatch(expected, {k: v for k, v in weights.items() if k not in optional})
        if mismatch:
            raise CheckpointError(f"{path}: its weights do not fit this config's model ({mismatch})")


def check_resume_path(trainer, ckpt_path) -> None:
    """Before Lightning reads ``--ckpt_path``: a URL is refused in one line, and a local file is read
    through the project's loader (files.py: ``safe_torch_load``, weights only). The run's checkpoint
    plugin (checkpoint_io.py: DurableCheckpointIO) loads with it; without a trainer yet, or with a
    plugin of the config's own, which would load with something else, the file is checked here."""
    from captioning.training.checkpoint_io import DurableCheckpointIO, refuse_url

    if ckpt_path is None or str(ckpt_path) in ("best", "last", "hpc", "registry"):
        return
    refuse_url(ckpt_path)
    if trainer is None or not isinstance(trainer.strategy.checkpoint_io, DurableCheckpointIO):
        from captioning.files import safe_torch_load

        safe_torch_load(os.fspath(ckpt_path))


# ---------------------------------------------------------------------- --ckpt_path last
def checkpoint_folders(trainer) -> list[str]:
    """The folders this run's configuration writes last.ckpt to, newest run first: a ModelCheckpoint's
    own ``dirpath``; else, as Lightning names them, ``default_root_dir/checkpoints`` without a
    logger, or the logger's ``save_dir/name/version_*/checkpoints`` (highest version first)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    explicit = [c.dirpath for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath]
    if explicit:
        return explicit
    logger = trainer.loggers[0] if trainer.loggers else None
    if logger is None:
        return [os.path.join(trainer.default_root_dir, "checkpoints")]
    save_dir = logger.save_dir or trainer.default_root_dir
    base = os.path.join(save_dir, str(logger.name)) if logger.name else save_dir
    configured = getattr(logger, "_version", None)
    if configured is not None:  # the logger names its version: that folder only
        version = configured if isinstance(configured, str) else f"version_{configured}"
        return [os.path.join(base, version, "checkpoints")]
    found = []
    for folder in glob.glob(os.path.join(glob.escape(base), "version_*")):
        number = re.fullmatch(r"version_(\d+)", os.path.basename(folder))
        if number:
            found.append((int(number.group(1)), os.path.join(folder, "checkpoints")))
    return [folder for _, folder in sorted(found, reverse=True)]


def last_checkpoint(trainer) -> str:
    """``--ckpt_path last``: the last.ckpt of this run's newest folder (:func:`checkpoint_folders`)
    that has one; a one-line ConfigError naming where it looked if none has."""
    folders = checkpoint_folders(trainer)
    for folder in folders:
        path = os.path.join(folder, "last.ckpt")
        if os.path.isfile(path):
            return path
    where = ", ".join(folders[:2]) + (", ..." if len(folders) > 2 else "") if folders else "no version folder yet"
    raise ConfigError(
        f"--ckpt_path last: no last.ckpt under {os.path.abspath(trainer.default_root_dir)} "
        f"(trainer.default_root_dir; looked in {where}); give the checkpoint's path"
    )
