"""Learning-rate schedules (``model.optimizer.schedule``): torch's schedulers, stepped by Lightning.

Each is a factor of the base learning rates (every parameter group's), given to
``configure_optimizers`` with the interval Lightning steps it at; Lightning saves the scheduler's
state in checkpoints, so a resumed run continues the same sequence. The kinds:

- ``none``: the base rate throughout (the paper's Adam).
- ``step``: ruotianluo/ImageCaptioning.pytorch's decay, lr = base * rate ** ((t - start) // every)
  from t = start on (t: epochs, or optimizer steps with ``interval: step``); its COCO recipe is
  rate 0.8 every 3 epochs from epoch 0.
- ``plateau``: multiply by ``rate`` after ``patience`` validations without a better validation
  CIDEr (sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning: x0.8 after 8 epochs without improvement).
- ``warmup_cosine`` / ``warmup_linear``: linear warm-up from base / warmup_steps to base over
  ``warmup_steps`` optimizer steps, then a cosine (or linear) decay to base * final_lr_ratio at
  ``total_steps`` (default: the run's ``trainer.max_steps``, else its estimated steps).
- ``warmup_rsqrt``: the Transformer's schedule (Vaswani et al. 2017, "noam"): the same linear
  warm-up to base, then base * sqrt(warmup_steps / t), an inverse square root of the step.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import torch
from lightning.pytorch.callbacks import Callback

from captioning.errors import ConfigError

log = logging.getLogger(__name__)

KINDS = ("none", "step", "plateau", "warmup_cosine", "warmup_linear", "warmup_rsqrt")


@dataclass
class ScheduleConfig:
    """The learning rate over training (see the module's docstring for each kind).

    Args:
        kind: none, step, plateau, warmup_cosine, warmup_linear or warmup_rsqrt.
        interval: ``step`` decay's clock: "epoch" or "step" (optimizer steps).
        start: ``step``: the epoch (or step) the decay starts at.
        every: ``step``: epochs (or steps) between two decays.
        rate: the factor of each decay (``step``) or reduction (``plateau``).
        patience: ``plateau``: validations without a better val/CIDEr before the rate falls.
        warmup_steps: ``warmup_*``: optimizer steps of the linear warm-up.
        total_steps: ``warmup_*``: the step the decay ends at (default: trainer.max_steps, else
            the trainer's estimate from max_epochs).
        final_lr_ratio: ``warmup_*``: the learning rate at total_steps, as a fraction of the base.
    """

    kind: Literal["none", "step", "plateau", "warmup_cosine", "warmup_linear", "warmup_rsqrt"] = "none"
    interval: Literal["epoch", "step"] = "epoch"
    start: int = 0
    every: int = 3
    rate: float = 0.8
    patience: int = 8
    warmup_steps: int = 0
    total_steps: int | None = None
    final_lr_ratio: float = 0.0

    def __post_init__(self):
        where = "model.optimizer.schedule."
        if self.kind not in KINDS:
            raise ConfigError(f"{where}kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.interval not in ("epoch", "step"):
            raise ConfigError(f"{where}interval: expected 'epoch' or 'step', got {self.interval!r}")
        for name, low in (("start", 0), ("every", 1), ("patience", 1), ("warmup_steps", 0), ("total_steps", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"{where}{name}: expected an integer >= {low}, got {value!r}")
        if not (_number(self.rate) and 0 < self.rate <= 1):
            raise ConfigError(f"{where}rate: expected a number in (0, 1], got {self.rate!r}")
        if not (_number(self.final_lr_ratio) and 0 <= self.final_lr_ratio <= 1):
            raise ConfigError(f"{where}final_lr_ratio: expected a number in [0, 1], got {self.final_lr_ratio!r}")
        if self.total_steps is not None and self.warmup_steps >= self.total_steps:
            raise ConfigError(
                f"{where}warmup_steps: expected fewer than total_steps ({self.total_steps}), got {self.warmup_steps}"
            )


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class StepDecay:
    """rate ** ((t - start) // every) from t = start on, else 1 (a LambdaLR factor; its settings
    are its state, saved with the scheduler's)."""

    def __init__(self, start: int, every: int, rate: float):
        self.start, self.every, self.rate = start, every, rate

    def __call__(self, t: int) -> float:
        return self.rate ** ((t - self.start) // self.every) if t >= self.start else 1.0


class WarmupDecay:
    """(t + 1) / warmup for the first ``warmup`` steps, then a cosine or linear decay from 1 to
    ``final`` at step ``total`` (t: the optimizer step, 0-based; a LambdaLR factor). ``total`` None:
    the run's length is not known yet (:class:`RunLength` sets it when training starts; until then
    the decay has not begun)."""

    def __init__(self, warmup: int, total: int | None, final: float, shape: str):
        self.warmup, self.total, self.final, self.shape = warmup, total, final, shape

    def __call__(self, t: int) -> float:
        if t < self.warmup:
            return (t + 1) / self.warmup
        if self.total is None:
            return 1.0
        progress = min(max((t - self.warmup) / max(self.total - self.warmup, 1), 0.0), 1.0)
        fall = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.shape == "cosine" else 1.0 - progress
        return self.final + (1.0 - self.final) * fall


class WarmupRsqrt:
    """(t + 1) / warmup for the first ``warmup`` steps, then sqrt(warmup / (t + 1)) (t: the optimizer
    step, 0-based; a LambdaLR factor): Vaswani et al.'s d^-0.5 min(t^-0.5, t warmup^-1.5) scaled so
    that its peak is the base rate."""

    def __init__(self, warmup: int):
        self.warmup = max(warmup, 1)

    def __call__(self, t: int) -> float:
        return (t + 1) / self.warmup if t < self.warmup else math.sqrt(self.warmup / (t + 1))


def total_steps(config: ScheduleConfig, trainer) -> int | None:
    """The step a warm-up schedule's decay ends at: the config's, or trainer.max_steps; None where it
    is the trainer's estimate of the run, which :class:`RunLength` reads when training starts (read
    here, while ``configure_optimizers`` runs, it would build the training loader before a resumed run
    restores its place in the epoch, and the run would take other batches than the uninterrupted one)."""
    if config.total_steps is not None:
        return config.total_steps
    if trainer is not None and trainer.max_steps and trainer.max_steps > 0:
        return trainer.max_steps
    if trainer is None or trainer.max_epochs is None or trainer.max_epochs < 0:
        raise no_run_length(config.kind)
    return None


def no_run_length(kind: str) -> ConfigError:
    return ConfigError(
        f"model.optimizer.schedule.total_steps: {kind} needs the run's length; "
        "give total_steps, trainer.max_steps or trainer.max_epochs"
    )


def warn_if_inside_warmup(total: int, warmup: int) -> None:
    if warmup >= total:
        log.warning(
            "model.optimizer.schedule: the run's %d step%s end%s inside the %d-step warm-up "
            "(a short trial run: the learning rate never reaches its base)",
            total,
            "" if total == 1 else "s",
            "s" if total == 1 else "",
            warmup,
        )


class RunLength(Callback):
    """Gives a warm-up schedule's decay the run's length where neither the config nor trainer.max_steps
    does: the trainer's estimate of the run's optimizer steps, read when training starts (after a
    resumed run restored its place; a resumed run's schedule brings its length in the checkpoint)."""

    def on_train_start(self, trainer, pl_module) -> None:
        for config in trainer.lr_scheduler_configs:
            for factor in getattr(config.scheduler, "lr_lambdas", ()):
                if isinstance(factor, WarmupDecay) and factor.total is None:
                    estimate = trainer.estimated_stepping_batches
                    if not math.isfinite(estimate):  # e.g. a stream of unknown length
                        raise no_run_length("a warm-up schedule's decay")
                    factor.total = int(estimate)
                    warn_if_inside_warmup(factor.total, factor.warmup)


def with_schedule(
    optimizer: torch.optim.Optimizer, config: ScheduleConfig, trainer=None, automatic: bool = True
) -> torch.optim.Optimizer | dict:
    """What ``configure_optimizers`` returns: the optimizer, with its scheduler and the interval
    Lightning steps it at unless ``config.kind`` is none. ``automatic``: the module's automatic
    optimisation (Lightning steps schedulers only then)."""
    if config.kind == "none":
        return optimizer
    if not automatic:
        raise ConfigError(
            f"model.optimizer.schedule: {config.kind} is stepped by Lightning's automatic optimisation, "
            "which model.cuda_graphs replaces; train without one of them"
        )
    if config.kind == "plateau":
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=config.rate, patience=config.patience - 1
        )
        # strict false: epochs without a validation (check_val_every_n_epoch > 1) do not step it
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val/CIDEr", "interval": "epoch", "strict": False},
        }
    if config.kind == "step":
        factor, interval = StepDecay(config.start, config.every, config.rate), config.interval
    elif config.kind == "warmup_rsqrt":
        factor, interval = WarmupRsqrt(config.warmup_steps), "step"
    else:
        if config.final_lr_ratio == 1.0 and config.total_steps is None:
            # constant after the warm-up: the run's length changes nothing
            total = (
                trainer.max_steps if trainer is not None and (trainer.max_steps or 0) > 0 else config.warmup_steps + 1
            )
        else:
            total = total_steps(config, trainer)
        if total is not None:  # (a total_steps of the config's own was checked with it)
            warn_if_inside_warmup(total, config.warmup_steps)
        factor, interval = (
            WarmupDecay(config.warmup_steps, total, config.final_lr_ratio, config.kind.split("_")[1]),
            "step",
        )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}


class EpochClock(Callback):
    """Tells the objective the epoch when each training epoch starts (``Objective.start_epoch``;
    e.g. scheduled sampling's probability is a function of it: objectives/cross_entropy.py)."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        pl_module.objective.start_epoch(trainer.current_epoch)


def recipe_callbacks(module) -> list:
    """The callbacks of a module's training recipe: the validation of the final weights
    (callbacks.py), the objective's epoch clock, and the moving average of the weights where
    ``model.optimizer.ema_decay`` asks for it (ema.py)."""
    from captioning.training.callbacks import FinalValidation
    from captioning.training.ema import WeightEMA

    config = module.optimizer_config
    return [
        FinalValidation(),
        EpochClock(),
        RunLength(),
        *([WeightEMA(config.ema_decay, config.ema_start_step)] if config.ema_decay is not None else []),
    ]
