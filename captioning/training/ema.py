"""An exponential moving average of the weights (``model.optimizer.ema_decay``): Lightning's
EMAWeightAveraging, which keeps the average in a copy of the module (torch's AveragedModel),
swaps it in for validation and saves it as the checkpoint's weights (the training weights are kept
beside it, under ``current_model_state``, for resuming).

After each optimizer step from ``start_step`` on (0-based), the average w_ema becomes
decay * w_ema + (1 - decay) * w; its first update copies the weights. Until then there is no
average: validation scores the training weights, checkpoints save them as the model, and a run
that ends before ``start_step`` ends with them.
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

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self.started():
            super().on_validation_epoch_end(trainer, pl_module)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._average_model is not None and not self.started():  # no average yet: the training weights are the model
            checkpoint["state_dict"] = checkpoint["current_model_state"]

    def on_train_end(self, trainer, pl_module) -> None:
        if self.started():
            super().on_train_end(trainer, pl_module)
