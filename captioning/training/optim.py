"""The optimizer: Adam over the decoder (and a from-scratch encoder), a pretrained encoder's
fine-tuned blocks at their own learning rate; its learning-rate schedule (schedules.py) and the
moving average of the weights (ema.py) are settings of the same config."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from captioning.errors import ConfigError
from captioning.training.schedules import ScheduleConfig, with_schedule


@dataclass
class OptimizerConfig:
    """Adam.

    Args:
        lr: learning rate of the decoder (and of a from-scratch encoder).
        weight_decay: L2 penalty.
        encoder_lr: learning rate of a pretrained encoder's fine-tuned blocks (default: lr).
        schedule: the learning rate over training (schedules.py; default: constant).
        ema_decay: keep an exponential moving average of the weights with this decay per step
            (e.g. 0.999), validate it and save it as the model (ema.py); None: no average.
        ema_start_step: the optimizer step the average starts at (it copies the weights there).
    """

    lr: float = 2e-4
    weight_decay: float = 0.0
    encoder_lr: float | None = None
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    ema_decay: float | None = None
    ema_start_step: int = 0

    def __post_init__(self):
        if isinstance(self.schedule, dict):  # a checkpoint's plain values
            self.schedule = ScheduleConfig(**self.schedule)
        for name in ("lr", "encoder_lr"):
            value = getattr(self, name)
            if value is not None and not (_number(value) and math.isfinite(value) and value > 0):
                raise ConfigError(f"model.optimizer.{name}: expected a finite number > 0, got {value!r}")
        if not (_number(self.weight_decay) and math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"model.optimizer.weight_decay: expected a finite number >= 0, got {self.weight_decay!r}")
        if self.ema_decay is not None and not (_number(self.ema_decay) and 0 < self.ema_decay < 1):
            raise ConfigError(
                f"model.optimizer.ema_decay: expected a number in (0, 1), e.g. 0.999, got {self.ema_decay!r}"
            )
        if isinstance(self.ema_start_step, bool) or not isinstance(self.ema_start_step, int) or self.ema_start_step < 0:
            raise ConfigError(f"model.optimizer.ema_start_step: expected an integer >= 0, got {self.ema_start_step!r}")


def _number(value: int | float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def build_optimizer(model, config: OptimizerConfig, mixed_precision: bool) -> torch.optim.Adam:
    """Adam over ``model``'s (a ShowAttendTell) trainable parameters: a group for the decoder, one for the encoder.

    The fused kernel updates all parameters in one pass instead of a loop of small kernels per
    tensor. Lightning's mixed-precision plugin refuses gradient clipping with a fused optimizer,
    so bf16/16-mixed runs (and other devices) keep the default.
    """
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    groups = [{"params": [p for p in model.decoder.parameters() if p.requires_grad], "lr": config.lr}]
    if encoder_params:
        groups.append({"params": encoder_params, "lr": config.encoder_lr or config.lr})
    fused = not mixed_precision and all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
    return torch.optim.Adam(groups, lr=config.lr, weight_decay=config.weight_decay, fused=fused or None)


def configure_optimizers(module, config: OptimizerConfig):
    """What a LightningModule's ``configure_optimizers`` returns: Adam over ``module.model`` with
    the schedule of ``config`` (schedules.py)."""
    optimizer = build_optimizer(module.model, config, "mixed" in str(module.trainer.precision))
    return with_schedule(optimizer, config.schedule, module.trainer, module.automatic_optimization)
