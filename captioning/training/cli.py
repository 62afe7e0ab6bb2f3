"""``captioning fit | validate | test``: LightningCLI over CaptioningModule and CaptionDataModule.

Configuration is the typed arguments of the two classes (``--config``, ``--print_config``,
``--model.decoder.hidden_dim 256`` style overrides, a saved config.yaml per run). ``data.image_size``
feeds ``model.image_size``, and the encoder's interpolation ``data.interpolation``. Checkpoints: unless the configuration names a ModelCheckpoint of its
own, the run keeps the best checkpoint by validation CIDEr (``best-{epoch}-{step}.ckpt``) and
``last.ckpt`` (at each validation, every 10 minutes of training, and when stopped by Ctrl-C or
SIGTERM); a ModelCheckpoint in ``trainer.callbacks`` replaces that default, and
``--trainer.enable_checkpointing false`` writes none. Every checkpoint is written durably
(training/checkpoint_io.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from jsonargparse import Namespace
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from captioning.data.datamodule import CaptionDataModule
from captioning.objectives import current_spelling
from captioning.training.allocator import keep_freed_memory
from captioning.training.callbacks import LastCheckpoint, LineProgress, RunPaths, ValidationExamples, quiet_third_party
from captioning.training.checkpoint_io import DurableCheckpointIO
from captioning.training.module import CaptioningModule
from captioning.training.resume import check_resume_path, last_checkpoint


def _encoder_interpolation(encoder) -> str:
    """``data.interpolation`` of the ``model.encoder`` settings (an EncoderConfig or its namespace)."""
    from captioning.models.encoders import EncoderConfig
    from captioning.models.spec import encoder_interpolation

    name = getattr(encoder, "name", None) or (encoder.get("name") if isinstance(encoder, dict) else None)
    return encoder_interpolation(EncoderConfig(name=name)) if name else "bilinear"


def default_checkpoint() -> ModelCheckpoint:
    """The best checkpoint by validation CIDEr, and the last one for resuming (written at each
    validation; LastCheckpoint writes the same file between them and when the run is stopped)."""
    return ModelCheckpoint(
        monitor="val/CIDEr", mode="max", save_last=True, filename="best-{epoch}-{step}", enable_version_counter=False
    )


def one_line_parser_error(message: str) -> str:
    """jsonargparse's message for a bad value, reduced to one line that names the key and the problem.

    A plain key's message is two lines (``Parser key "K":`` and the problem); a bad value inside a
    class's init_args (e.g. ``--model.objective.init_args.lambda_r abc``) is a dozen, one block per
    Union subtype. Both become ``K: problem``: e.g. ``model.objective: lambda_r: Expected a <class
    'float'>. Got value: abc`` (the class's own parser, this class too, already made its part one
    line; nested ``Parser key`` lines of another parser's are joined to K). Any other message is kept."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0].startswith('Parser key "'):
        return message
    keys, problem = [lines[0][len('Parser key "') :].rstrip(":").rstrip('"')], None
    rest = lines[1:]
    block = next((i for i, line in enumerate(rest) if line.startswith("- Problem with given class_path")), None)
    if block is not None:  # the failing class's block: the lines up to the next subtype's "- ..."
        rest = rest[block + 1 :]
        rest = rest[: next((i for i, line in enumerate(rest) if line.startswith("- ")), len(rest))]
    for line in rest:
        if line.startswith('Parser key "') and line.endswith('":'):
            keys.append(line[len('Parser key "') : -2])
        elif problem is None:
            problem = line
    if problem is None or (block is None and len(lines) != 2):
        return message
    return f"{'.'.join(keys)}: {problem}"


class ShortUsageParser(LightningArgumentParser):
    """A parser whose errors take three lines (usage, a pointer to --help, the error), not a hundred."""

    def print_usage(self, file=None) -> None:
        (file or sys.stdout).write(f"usage: {self.prog.replace(' [options]', '')} [options]\n")

    def error(self, message: str, ex=None):
        super().error(one_line_parser_error(message), ex)


class CaptioningCLI(LightningCLI):
    def init_parser(self, **kwargs) -> LightningArgumentParser:
        parser = super().init_parser(**kwargs)
        parser.__class__ = ShortUsageParser  # the same parser, with the short usage line
        return parser

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.image_size", "model.image_size")
        # the resize the encoder's weights expect (models/spec.py: encoder_interpolation)
        parser.link_arguments("model.encoder", "data.interpolation", compute_fn=_encoder_interpolation)

    def before_instantiate_classes(self) -> None:
        """An objective named in an earlier spelling (``HardAttentionReinforce`` with ``estimator:
        gumbel``) is built as this version names it (objectives/__init__.py: current_spelling)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        objective = config.get("model.objective")
        if objective is None or not objective.get("class_path"):
            return
        init_args = objective.get("init_args")
        init_args = init_args.as_dict() if isinstance(init_args, Namespace) else dict(init_args or {})
        class_path, init_args = current_spelling(objective["class_path"], init_args)
        if class_path != objective["class_path"]:
            config["model.objective"] = Namespace(class_path=class_path, init_args=Namespace(**init_args))

    def _run_subcommand(self, subcommand: str) -> None:
        """The subcommand; one that fails before its first training step (a data setup that refuses
        its files, Ctrl-C while loading) leaves no run folder of its own behind: the log folder it
        created (``lightning_logs/version_N``, holding a TensorBoard file with nothing in it) is
        removed, so that the next run is not numbered past an empty one. A folder holding a
        checkpoint is kept. (The logger's folders are listed, not asked for: asking fixes its
        version, which ``--ckpt_path last`` reads.)"""
        logger = self.trainer.logger if self.trainer.is_global_zero else None
        root = getattr(logger, "root_dir", None)  # lightning_logs/: the runs' version folders
        before = set(os.listdir(root)) if root and os.path.isdir(root) else None
        try:
            super()._run_subcommand(subcommand)
        except BaseException:
            if root and self.trainer.global_step == 0 and os.path.isdir(root):
                for name in sorted(set(os.listdir(root)) - (before or set())):
                    remove_unused_run_folder(os.path.join(root, name))
            raise

    def _parse_ckpt_path(self) -> None:
        """LightningCLI reads ``--ckpt_path``'s hyperparameters into the config before anything is
        built, with ``torch.load``: the file is first read by the project's loader, and a URL refused
        (training/resume.py: check_resume_path), so that a bad file is one line, not a traceback."""
        subcommand = self.config.get("subcommand")
        if subcommand:
            check_resume_path(None, self.config[subcommand].get("ckpt_path"))
        super()._parse_ckpt_path()

    def before_fit(self) -> None:
        """``--ckpt_path last``: the last.ckpt of this run's own checkpoint folders, the newest
        version's (training/resume.py: last_checkpoint; never another file under the root folder).
        Any checkpoint is read by the project's loader, and a URL refused (check_resume_path).
        (Lightning looks only in the new run's own checkpoint folder, and with the default logger
        every run gets a new ``version_N``, so it would never find the previous run's.)"""
        config = self.config_init[self.subcommand]
        if config.get("ckpt_path") == "last":
            config["ckpt_path"] = last_checkpoint(self.trainer)
            print(f"resuming from {config['ckpt_path']}", flush=True)
        check_resume_path(self.trainer, config.get("ckpt_path"))

    def before_validate(self) -> None:
        """A checkpoint to score goes through the project's loader (training/resume.py: check_resume_path)."""
        check_resume_path(self.trainer, self.config_init[self.subcommand].get("ckpt_path"))

    before_test = before_validate

    def instantiate_trainer(self, **kwargs):
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer = config["trainer"]
        callbacks = list(trainer.get("callbacks") or [])
        checkpointing = trainer.get("enable_checkpointing") is not False
        if checkpointing and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            callbacks += [default_checkpoint(), LastCheckpoint()]
        callbacks += [RunPaths(), ValidationExamples()]
        plain_output = not sys.stdout.isatty()  # a log file or CI: lines, not a repainting bar
        if (
            plain_output
            and trainer.get("enable_progress_bar") is not False
            and not any(isinstance(c, ProgressBar) for c in callbacks)
        ):
            callbacks.append(LineProgress(every=trainer.get("log_every_n_steps") or 50))
        kwargs["callbacks"] = callbacks
        plugins = trainer.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):  # every checkpoint written durably
            kwargs["plugins"] = [*plugins, DurableCheckpointIO()]
        model = getattr(self, "model", None)
        if model is not None and not model.automatic_optimization and trainer.get("gradient_clip_val"):
            # Lightning clips only in automatic optimisation; the captured step clips itself
            model.step_strategy.clip_val = float(trainer["gradient_clip_val"])
            kwargs["gradient_clip_val"] = None
        return super().instantiate_trainer(**kwargs)


def remove_unused_run_folder(folder: str) -> None:
    """Remove ``folder``, a log folder this process created and never used: it holds nothing, or only
    this process's TensorBoard files (``events.out.tfevents.TIME.HOST.PID.N``, PID ours: not those of
    another run started meanwhile) and the config Lightning saves; and its parent if that is left
    empty. Anything else there (a checkpoint, another process's file) keeps it. Links in it are
    removed, never followed."""
    import shutil

    pid = str(os.getpid())
    for _, _, files in os.walk(folder):
        for name in files:
            ours = name.startswith("events.out.tfevents.") and pid in name.split(".")[4:]
            if not ours and name not in ("config.yaml", "hparams.yaml"):
                return
    shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(folder))  # lightning_logs/, when this run's was its only folder
    except OSError:
        pass


def run_lightning_cli(args: Sequence[str], run: bool = True) -> CaptioningCLI:
    """The CLI on ``args`` as if typed: a subcommand and its arguments, or with ``run=False`` the
    arguments alone (parse and build the model, data and trainer without running anything)."""
    quiet_third_party()
    keep_freed_memory()  # the step's large tensors reuse the last step's memory (training/allocator.py)
    argv, sys.argv = sys.argv, sys.argv[:1] + list(args)  # LightningCLI reads sys.argv
    try:
        return CaptioningCLI(CaptioningModule, CaptionDataModule, run=run, save_config_kwargs={"overwrite": True})
    finally:
        sys.argv = argv
