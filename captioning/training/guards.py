"""What keeps a training run reproducible and safe, apart from the step itself: per-step seeding,
the non-finite-loss guards (on the host, or counted on the device for the captured step) and TF32.

The callbacks are the LightningModule's own (``CaptioningModule.configure_callbacks``): every
trainer gets them, the CLI's or one built in a test.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from captioning.errors import CaptioningError
from captioning.objectives import ObjectiveOutput

log = logging.getLogger(__name__)


def step_seed(run_seed: int, step: int, rank: int) -> int:
    """The seed of one training step on one process: each rank draws its own dropout masks and
    hard-attention samples, and a run resumed at ``step`` draws what it would have drawn."""
    return int(np.random.SeedSequence([run_seed, step, rank]).generate_state(1, np.uint64)[0] % 2**63)


class StepSeeding(Callback):
    """Dropout and hard attention draw from the global generator: seeded before every training
    step from the run's seed (``seed_everything``'s, read once at the start of the fit), the global
    step and the rank."""

    def __init__(self):
        self.run_seed: int | None = None  # set when the fit starts

    def on_fit_start(self, trainer, pl_module) -> None:
        self.run_seed = torch.initial_seed()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        torch.manual_seed(step_seed(self.run_seed, trainer.global_step, trainer.global_rank))


class TF32(Callback):
    """TensorFloat-32 matmuls and convolutions (float32 storage, 10-bit mantissa products) when the
    fit runs on a CUDA device."""

    def on_fit_start(self, trainer, pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True


class NonFiniteLoss:
    """A step's loss checked on the host: ``"error"`` stops the run naming the step, ``"skip"``
    skips it and leaves no trace (the buffers its forward pass changed, e.g. batch-norm running
    statistics, are put back; no optimizer step follows: the step returns None)."""

    def __init__(self, mode: Literal["error", "skip"]):
        self.skip = mode == "skip"

    def __call__(self, module, batch_idx: int, step: Callable[[], ObjectiveOutput]) -> ObjectiveOutput | None:
        """``step()``'s output if its loss is finite, else None (skip) or a CaptioningError (error)."""
        saved = [b.clone() for b in module.buffers()] if self.skip else None
        out = step()
        if torch.isfinite(out.loss):
            return out
        message = (
            f"non-finite loss ({out.loss.item()}) at global step {module.global_step} "
            f"(epoch {module.current_epoch}, batch {batch_idx})"
        )
        if saved is None:
            raise CaptioningError(message + "; set --model.nonfinite_loss skip to skip such steps")
        with torch.no_grad():
            for buffer, value in zip(module.buffers(), saved):
                buffer.copy_(value)
        log.warning("%s: step skipped", message)
        module.log("train/skipped_steps", 1.0, reduce_fx="sum", on_step=False, on_epoch=True)
        return None


class NonFiniteCount(Callback):
    """The captured step's guard: its steps' non-finite losses are counted on the device (nothing
    read back inside a step) and the count is read every ``every`` steps, before each validation
    (before a checkpoint could keep weights a non-finite step made) and at the end of training; any
    stops the run."""

    def __init__(self, every: int = 50):
        self.every, self.count = every, None

    def add(self, finite: Tensor) -> None:
        """One step's ``isfinite(loss)`` (a 0-d bool tensor on the device)."""
        bad = (~finite).int()
        self.count = bad if self.count is None else self.count + bad

    def check(self, trainer) -> None:
        """Read the count (one host read); a one-line CaptioningError if any step was non-finite."""
        if self.count is not None and int(self.count) > 0:
            raise CaptioningError(
                f"non-finite loss in {int(self.count)} step(s) at or before global step "
                f"{trainer.global_step} (epoch {trainer.current_epoch}); the weights after them are not "
                "usable: resume from the last checkpoint with a lower learning rate, or train without "
                "model.cuda_graphs and with --model.nonfinite_loss skip"
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every == 0:
            self.check(trainer)

    def on_validation_start(self, trainer, pl_module) -> None:
        self.check(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self.check(trainer)
