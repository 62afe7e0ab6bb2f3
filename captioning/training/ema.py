"""An exponential moving average of the weights (``model.optimizer.ema_decay``): Lightning's
EMAWeightAveraging, which keeps the average in a copy of the module (torch's AveragedModel),
swaps it in for validation and saves it as the checkpoint's weights (the training weights are kept
beside it, under ``current_model_state``, for resuming).

After each optimizer step from ``start_step`` on (0-based), the average w_ema becomes
decay * w_ema + (1 - decay) * w; its first update copies the weights. Until then there is no
average: validation scores the training weights, checkpoints save them as the model, and a run
that ends before ``start_step`` ends with them.

Every checkpoint holds the run as of the step it records, whoever writes it and when: the average as
the model (``state_dict``), the training weights beside it (``current_model_state``), the average
updated for that step. Two moments need care. One is a checkpoint written inside a validation (last.ckpt
of a run stopped by a signal there), while the module holds the average and the copy the training
weights. The other is one written at the end of a training batch by a callback whose hook runs before
this one's (LastCheckpoint: a signal, the periodic save), before the average's update for that step.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import EMAWeightAveraging


class WeightEMA(EMAWeightAveraging):
    """The average of the module's weights with ``decay`` per step, from optimizer step ``start_step``.

    The copy is made when fitting starts (or a checkpoint is restored): the module builds its model
    in its own ``setup``, which Lightning calls after the callbacks'.
    """

    def __init__(self, decay: float, start_step: int = 0):
        super().__init__(decay=decay, update_starting_at_step=start_step)
        self._swapped = False  # inside a validation: the module holds the average, the copy the training weights

    def setup(self, trainer, pl_module, stage: str) -> None:
        pass  # the model does not exist yet: see _ensure

    def _ensure(self, trainer, pl_module) -> None:
        if self._average_model is None and trainer.state.fn == "fit":
            super().setup(trainer, pl_module, "fit")

    def on_fit_start(self, trainer, pl_module) -> None:
        self._ensure(trainer, pl_module)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self._ensure(trainer, pl_module)
        if self._average_model is not None:  # (validate, test: the checkpoint's weights are the average)
            super().on_load_checkpoint(trainer, pl_module, checkpoint)

    def started(self) -> bool:
        """Whether the average has had its first update (its copy of the weights)."""
        return self._average_model is not None and int(self._average_model.n_averaged) > 0

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._ensure(trainer, pl_module)
        if self.started():  # the average in for validation, once there is one (no update comes before the end)
            super().on_validation_epoch_start(trainer, pl_module)
            self._swapped = True

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self._swapped:
            super().on_validation_epoch_end(trainer, pl_module)
            self._swapped = False

    def _update_due(self, trainer) -> bool:
        """Whether the update for the optimizer step just made is still to come (this callback's
        ``on_train_batch_end`` makes it, as Lightning's does, unless a checkpoint made it first)."""
        return trainer.global_step > self._latest_update_step and self.should_update(step_idx=trainer.global_step - 1)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self._average_model is not None and not self._swapped and trainer.training and self._update_due(trainer):
            # a checkpoint at the end of a training batch, before this callback's update for the step it
            # records: made now (the weights are the step's; the hook then finds it made), and the
            # callback's state that Lightning collected before this hook recorded again
            self._average_model.update_parameters(pl_module)
            self._latest_update_step = trainer.global_step
            checkpoint["callbacks"][self.state_key] = self.state_dict()
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._swapped:  # inside a validation the module holds the average and the copy the training weights
            checkpoint["state_dict"], checkpoint["current_model_state"] = (
                checkpoint["current_model_state"],
                checkpoint["state_dict"],
            )
        if self._average_model is not None and not self.started():  # no average yet: the training weights are the model
            checkpoint["state_dict"] = checkpoint["current_model_state"]

    def on_train_end(self, trainer, pl_module) -> None:
        if self.started():
            super().on_train_end(trainer, pl_module)
