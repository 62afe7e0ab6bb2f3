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
        print(f"epoch {trainer.current_epoch}  step {step}  {loss_text}{rate:.2f} steps/s  "
              f"{(now - self._start) / 60:.1f} min", flush=True)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not (self._enabled and trainer.is_global_zero) or trainer.sanity_checking:
            return
        scores = {k.split("/", 1)[1]: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if scores:
            text = "  ".join(f"{k} {v:.3f}" for k, v in sorted(scores.items()))
            print(f"validation after step {trainer.global_step}: {text}", flush=True)


class ValidationExamples(Callback):
    """After each validation, a few fixed validation images with their captions and attention maps
    (a panel per word, as ``captioning attend --format png`` draws them) in TensorBoard's images tab.

    Needs a logger that can take images (TensorBoard, the default) and image files (not a feature cache).
    """

    def __init__(self, count: int = 4, panel_size: int = 128):
        super().__init__()
        self.count, self.panel_size = count, panel_size

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        writer = getattr(trainer.logger, "experiment", None)
        dm = trainer.datamodule
        if trainer.sanity_checking or not trainer.is_global_zero or not hasattr(writer, "add_image") \
                or dm is None or dm.features is not None:
            return
        import os

        import numpy as np
        import torch

        from captioning.viz.attention_maps import grid_shape
        from captioning.data.images import load_image, to_tensor
        from captioning.errors import ImageError
        from captioning.viz.pictures import render_grid

        pictures = []
        for record in dm.records("val")[: self.count]:
            try:
                pictures.append(load_image(os.path.join(dm.images_root, record.path)))
            except ImageError:
                continue
        if not pictures:
            return
        model = pl_module.model
        batch = torch.stack([to_tensor(p, pl_module.image_size) for p in pictures]).to(pl_module.device)
        out = model.generate(images=batch, config=pl_module.val_generation)
        for i, picture in enumerate(pictures):
            words = model.vocab.decode(out.sequences[i].tolist())
            alphas = out.alphas[i, : len(words)].cpu().numpy()
            grid = grid_shape(alphas.shape[-1])
            cells = out.locations[i, : len(words)].tolist() if model.attention_kind == "hard" and out.locations.dim() == 2 else None
            panels = render_grid(picture, words, alphas.reshape(len(words), *grid), hard_cells=cells,
                                 panel_size=self.panel_size)
            writer.add_image(f"val_examples/{i}", np.asarray(panels), trainer.global_step, dataformats="HWC")


class LastCheckpoint(Callback):
    """``last.ckpt`` beside the run's other checkpoints: after every validation, every ``minutes`` of
    training, and when the run is stopped by Ctrl-C (SIGINT) or SIGTERM, at the end of the step under
    way, before exiting. (ModelCheckpoint's ``save_last`` rewrites it only when it also saves a best
    checkpoint, so between improvements it would lag behind the run.)

    Resuming from it (``--ckpt_path .../last.ckpt``) continues the unfinished epoch exactly. Under
    DDP the signals are left to Lightning's own handling. A second Ctrl-C stops at once.
    """

    def __init__(self, minutes: float = 10.0):
        super().__init__()
        self.minutes = minutes
        self._signal = None
        self._previous: dict = {}
        self._saved_at = time.monotonic()

    def _path(self, trainer):
        import os

        folders = [c.dirpath for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath]
        return os.path.join(folders[0] if folders else trainer.default_root_dir, "last.ckpt")

    def _request(self, signum, frame) -> None:
        import signal

        if self._signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._signal = signum

    def on_fit_start(self, trainer, pl_module) -> None:
        import signal
        import threading

        self._saved_at = time.monotonic()
        if trainer.world_size > 1 or threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._request)

    def _restore(self) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def on_fit_end(self, trainer, pl_module) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()

    def _save(self, trainer) -> str:
        import os

        path = self._path(trainer)
        tmp = path + ".tmp"
        trainer.save_checkpoint(tmp, weights_only=False)  # (a full checkpoint; saying so keeps Lightning quiet)
        if trainer.is_global_zero:
            os.replace(tmp, path)  # a reader sees the old file or the new one, never half of one
        self._saved_at = time.monotonic()
        return path

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._save(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import signal

        # Lightning installs its own SIGTERM handler when its loop starts: keep ours in front.
        if self._previous and signal.getsignal(signal.SIGTERM) != self._request:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._request)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._signal is not None:
            import signal

            name = signal.Signals(self._signal).name
            path = self._save(trainer)
            print(f"\n{name}: stopped after step {trainer.global_step}; wrote {path}\n"
                  f"resume with the same command and --ckpt_path {path}", flush=True)
            raise SystemExit(128 + self._signal)
        if self.minutes and time.monotonic() - self._saved_at >= 60 * self.minutes:
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
