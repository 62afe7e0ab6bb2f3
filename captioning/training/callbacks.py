"""What a training run shows a person: where its files go, progress that reads well in a log file,
and no third-party adverts or deprecation chatter.

* :class:`RunPaths` prints, when fitting starts, the checkpoint folder, the log folder and how to
  look at the curves (TensorBoard).
* :class:`LineProgress` replaces the repainting progress bar when standard output is not a terminal
  (a redirected log, CI): a line every ``every`` training steps and one per validation.
* :func:`quiet_third_party` filters the warnings and messages of other packages that say nothing
  about the user's run (tips advertising other products, deprecations inside libraries).
"""

from __future__ import annotations

import logging
import re
import sys
import time
import warnings

from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar

from captioning.training.stopping import StopSignals, agree, cpu_group, validation_not_begun

log = logging.getLogger(__name__)

#: messages of other packages that say nothing about the run (matched at the start of the message)
_NOISE = (
    "💡 Tip:",  # Lightning's adverts for its cloud products
    "`isinstance(treespec, LeafSpec)` is deprecated",
    "Starting from v1.9.0, `tensorboardX` has been removed",
    "The number of training batches",  # log_every_n_steps larger than a tiny epoch
    "`Trainer(limit_val_batches=1.0)` was configured",
    "`Trainer(limit_train_batches=1.0)` was configured",
    "You defined a `validation_step` but have no `val_dataloader`",
    "Checkpoint directory",  # "exists and is not empty": a resumed run writes there on purpose
)


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).lstrip().startswith(_NOISE)


def quiet_third_party() -> None:
    """Drop the messages in ``_NOISE`` from Lightning's loggers and Python's warnings (idempotent)."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise())
    for text in _NOISE:
        warnings.filterwarnings("ignore", message=".*" + re.escape(text))


class RunPaths(Callback):
    """Prints where the run writes its checkpoints and logs, once, when fitting starts."""

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        folders = sorted({c.dirpath for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath})
        for folder in folders:
            print(f"checkpoints: {folder}")
        if trainer.logger is not None and trainer.log_dir:
            print(f"logs:        {trainer.log_dir}  (curves: tensorboard --logdir {trainer.log_dir})")
        sys.stdout.flush()


class LineProgress(ProgressBar):
    """Progress as plain lines (no carriage returns): for logs redirected to a file.

    A line every ``every`` training steps (epoch, step, loss, steps per second) and one per
    validation with its scores.
    """

    def __init__(self, every: int = 50):
        super().__init__()
        self.every = every
        self._enabled = True
        self._start = time.perf_counter()
        self._last = (0, self._start)

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not (self._enabled and trainer.is_global_zero) or step == 0 or step % self.every:
            return
        now = time.perf_counter()
        rate = (step - self._last[0]) / max(now - self._last[1], 1e-9)
        self._last = (step, now)
        loss = trainer.callback_metrics.get("train/loss")
        loss_text = f"loss {float(loss):.3f}  " if loss is not None else ""
        print(
            f"epoch {trainer.current_epoch}  step {step}  {loss_text}{rate:.2f} steps/s  "
            f"{(now - self._start) / 60:.1f} min",
            flush=True,
        )

    def on_validation_end(self, trainer, pl_module) -> None:
        if not (self._enabled and trainer.is_global_zero) or trainer.sanity_checking:
            return
        scores = {k.split("/", 1)[1]: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if scores:
            text = "  ".join(f"{k} {v:.3f}" for k, v in sorted(scores.items()))
            print(f"validation after step {trainer.global_step}: {text}", flush=True)


class ValidationExamples(Callback):
    """After each validation, a few fixed validation images with their captions and attention maps
    (a panel per word, as ``captioning attend --format png`` draws them) to every logger of the run:
    TensorBoard's images tab, W&B's media, MLflow's artifacts, PNG files beside a CSV log
    (training/tracking.py: ``log_picture``).

    Needs a logger and the images themselves (not a feature cache): read through the data's own route (``CaptionData.read_image``: an image file, a
    WebDataset shard's member, a Hub dataset's image), as every other reader of the data does. A
    validation none of whose images can be read logs a warning once and draws nothing.
    """

    def __init__(self, count: int = 4, panel_size: int = 128):
        super().__init__()
        self.count, self.panel_size = count, panel_size
        self._warned = False

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        if (
            trainer.sanity_checking
            or not trainer.is_global_zero
            or not trainer.loggers
            or dm is None
            or dm.features is not None
        ):
            return
        import numpy as np
        import torch

        from captioning.common import grid_shape
        from captioning.data.images import to_tensor
        from captioning.errors import ImageError
        from captioning.training.tracking import log_picture
        from captioning.viz.pictures import render_grid

        pictures, problems = [], []
        for record in dm.records("val")[: self.count]:
            try:
                pictures.append(dm.read_image(record))
            except ImageError as err:
                problems.append(str(err))
        if not pictures:
            if problems and not self._warned:
                self._warned = True
                log.warning(
                    "validation examples: none of the first %d validation images could be read (%s)",
                    len(problems),
                    problems[0],
                )
            return
        model = pl_module.fast
        batch = torch.stack([to_tensor(p, pl_module.image_size, model.spec.interpolation) for p in pictures]).to(
            pl_module.device
        )
        out = model.generate(images=batch, config=pl_module.val_generation)
        for i, picture in enumerate(pictures):
            words = model.vocab.decode(out.sequences[i].tolist())
            alphas = out.alphas[i, : len(words)].cpu().numpy()
            grid = grid_shape(alphas.shape[-1])
            cells = (
                out.locations[i, : len(words)].tolist()
                if model.attention_kind == "hard" and out.locations.dim() == 2
                else None
            )
            panels = render_grid(
                picture, words, alphas.reshape(len(words), *grid), hard_cells=cells, panel_size=self.panel_size
            )
            for logger in trainer.loggers:
                log_picture(logger, f"val_examples/{i}", np.asarray(panels), trainer.global_step, " ".join(words))


class LastCheckpoint(Callback):
    """``last.ckpt`` beside the run's other checkpoints: after every validation, every ``minutes`` of
    training, and when the run is stopped by Ctrl-C (SIGINT) or SIGTERM. (ModelCheckpoint's
    ``save_last`` rewrites it only when it also saves a best checkpoint, so between improvements it
    would lag behind the run.)

    Stopping (training/stopping.py): the first signal is acted on at the end of the batch under way,
    a training or a validation batch: last.ckpt is written and the process exits with status 128 +
    the signal's number; a second signal exits at once, without a checkpoint. Under DDP the ranks
    agree at every batch on whether one of them was signalled and on whether the periodic save is
    due (by rank 0's clock), so that all of them save, and stop, at the same batch.

    Resuming from it (``--ckpt_path .../last.ckpt``) continues the run exactly. Stopped during a
    validation, the checkpoint is the run as it was when that validation began (the weights do not
    change during one): the resumed run does that validation again, from its first batch. The file
    is written durably (checkpoint_io.py), also by a trainer that was not given that plugin.
    """

    def __init__(self, minutes: float = 10.0):
        super().__init__()
        self.minutes = minutes
        self.signals = StopSignals()
        self._group = None
        self._saved_at = time.monotonic()
        self._validation_undone = False

    def _path(self, trainer):
        import os

        folders = [c.dirpath for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath]
        return os.path.join(folders[0] if folders else trainer.default_root_dir, "last.ckpt")

    def setup(self, trainer, pl_module, stage: str) -> None:
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

        from captioning.training.checkpoint_io import DurableCheckpointIO

        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = DurableCheckpointIO()

    def on_fit_start(self, trainer, pl_module) -> None:
        import signal

        self._saved_at = time.monotonic()
        self._group = cpu_group(trainer)
        launcher = trainer.strategy.launcher  # a second signal takes the other DDP processes along
        self.signals.on_second = (
            None if launcher is None else lambda: launcher.kill(getattr(signal, "SIGKILL", signal.SIGTERM))
        )
        self.signals.install()

    def on_fit_end(self, trainer, pl_module) -> None:
        self.signals.restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.signals.restore()

    def _save(self, trainer) -> str:
        path = self._path(trainer)
        trainer.save_checkpoint(path, weights_only=False)  # (a full checkpoint; saying so keeps Lightning quiet)
        self._saved_at = time.monotonic()
        return path

    def _act(self, trainer, due: bool) -> None:
        """Every rank, at the same batch: stop if a rank was signalled, else save if rank 0 says it is due."""
        signum, due = agree(trainer, self._group, self.signals.requested, due)
        if signum is not None:
            self._stop(trainer, signum)
        if due:
            self._save(trainer)

    def _stop(self, trainer, signum: int) -> None:
        import signal

        name = signal.Signals(signum).name
        if trainer.sanity_checking:
            message = f"\n{name}: stopped in the sanity check, before training; no checkpoint written"
        else:
            self._validation_undone = trainer.validating
            path = self._save(trainer)
            message = (
                f"\n{name}: stopped after step {trainer.global_step}; wrote {path}\n"
                f"resume with the same command and --ckpt_path {path}"
            )
        if trainer.is_global_zero:
            print(message, flush=True)
        raise SystemExit(128 + signum)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self._validation_undone:  # stopped during a validation: a run that has yet to do it
            checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"] = validation_not_begun(
                checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
            )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.signals.keep_in_front()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._act(trainer, bool(self.minutes) and time.monotonic() - self._saved_at >= 60 * self.minutes)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.signals.keep_in_front()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.state.fn == "fit":
            self._act(trainer, False)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._save(trainer)


class FinalValidation(Callback):
    """Validates the final weights of a run that ``trainer.max_steps`` stops, so that they are scored
    and can become the best checkpoint. (Lightning validates at the end of an epoch, every
    ``val_check_interval`` and when a callback stops the run, as ``max_time`` does, but not at
    ``max_steps``: the steps since the last validation would never be scored.) Asking the run to stop
    at its last step makes that step's validation happen; a step that validates anyway (the end of an
    epoch) validates once."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True
