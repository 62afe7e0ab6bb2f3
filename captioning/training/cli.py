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
from pathlib import Path

import torch
from jsonargparse import Namespace
from jsonargparse.typing import PositiveInt
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from captioning.common import did_you_mean, fixed_threads
from captioning.data.datamodule import CaptionDataModule
from captioning.errors import ConfigError
from captioning.objectives import current_spelling
from captioning.plugins import load_plugins
from captioning.training.allocator import keep_freed_memory
from captioning.training.callbacks import LastCheckpoint, LineProgress, RunPaths, ValidationExamples, quiet_third_party
from captioning.training.checkpoint_io import DurableCheckpointIO
from captioning.training.module import CaptioningModule
from captioning.training.pace import PaceNote, ThreadWatch
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
    if rest[0].startswith("Does not validate against any of the Union subtypes"):  # e.g. an Optional[int]
        errors = [line[2:] for line in rest if line.startswith("- ") and "NoneType" not in line]
        given = next((line for line in rest if line.startswith("Given value:")), None)
        if errors and not any(line.startswith("- Problem with given class_path") for line in rest):
            return f"{keys[0]}: {errors[0]}" + (f" ({given})" if given else "")
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
    """A parser whose errors take three lines (usage, a pointer to --help, the error), not a hundred;
    an unknown key gets the nearest valid one ("did you mean --model.decoder.hidden_dim?")."""

    def print_usage(self, file=None) -> None:
        (file or sys.stdout).write(f"usage: {self.prog.replace(' [options]', '')} [options]\n")

    def error(self, message: str, ex=None):
        message = one_line_parser_error(message)
        if message.startswith("unrecognized arguments:"):
            parser = getattr(ex, "subcommand_parser", None) or self
            keys = [w.split("=", 1)[0] for w in message.split(":", 1)[1].split() if w.startswith("--")]
            message += did_you_mean(keys, [o for a in parser._actions for o in a.option_strings if o.startswith("--")])
        super().error(message, ex)

    def dump(self, cfg: Namespace, *args, **kwargs) -> str:
        """The configuration as YAML (``--print_config``, each run's config.yaml), the decoder's
        settings in full: the fields of its kind's config, given or default (models/kinds.py)."""
        decoder = cfg.get("model.decoder", "absent") if isinstance(cfg, Namespace) else "absent"
        if decoder != "absent":
            import dataclasses

            from captioning.models.kinds import decoder_config

            plain = decoder.as_dict() if isinstance(decoder, Namespace) else decoder
            cfg = cfg.clone()
            cfg["model.decoder"] = dataclasses.asdict(decoder_config(plain))
        return super().dump(cfg, *args, **kwargs)


#: the LightningCLI subcommands, which read a config
SUBCOMMANDS = ("fit", "validate", "test")


def configs_folder() -> Path:
    """The repository's configs/ folder (the package lies beside it in a clone)."""
    return Path(__file__).resolve().parents[2] / "configs"


def config_names() -> list[str]:
    """The configs of the repository's configs/ folder, as ``configs/NAME.yaml`` (none outside a clone)."""
    folder = configs_folder()
    return sorted(f"configs/{p.name}" for p in folder.glob("*.yaml")) if folder.is_dir() else []


def configs_listing(limit: int = 6) -> str:
    """ "configs/shapes_soft.yaml, configs/own_small_cnn.yaml, ... (25 in configs/)" for messages."""
    names = config_names()
    if not names:
        return "no configs/ folder beside the package (the configs ship with the repository's clone)"
    first = [
        n for n in ("configs/shapes_soft.yaml", "configs/own_small_cnn.yaml", "configs/coco_soft.yaml") if n in names
    ]
    shown = first + [n for n in names if n not in first][: max(0, limit - len(first))]
    more = f", ... ({len(names)} in {configs_folder()})" if len(names) > len(shown) else ""
    return ", ".join(shown) + more


def check_config_arguments(args: Sequence[str]) -> None:
    """``fit``, ``validate`` and ``test`` read a config: without ``--config`` a one-line error says
    which configs exist and how to pass one (or, with ``--data.annotations`` given, one line says the
    run uses the built-in defaults); a ``--config`` path that does not exist lists the configs."""
    args = list(args)
    configs = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--config", "-c")]
    configs += [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    for config in configs:
        if not Path(config).is_file() and not config.lstrip().startswith(("{", "[")):  # or YAML text
            raise ConfigError(f"--config {config}: no such file; the configs: {configs_listing()}")
    helping = any(a in ("-h", "--help") or a.startswith("--print_config") for a in args[1:])
    if configs or not args or args[0] not in SUBCOMMANDS or helping:
        return
    how = f"captioning {args[0]} --config configs/shapes_soft.yaml --data.annotations FILE"
    if not any(a.startswith("--data.annotations") or a == "--data" for a in args):
        raise ConfigError(
            f"captioning {args[0]}: no --config given: pass one ({how}); the configs: {configs_listing()}"
        )
    print(
        f"note: no --config: the model, data and trainer take the built-in defaults; a recipe is one of "
        f"{configs_listing()} (e.g. {how})",
        flush=True,
    )


class CaptioningCLI(LightningCLI):
    def init_parser(self, **kwargs) -> LightningArgumentParser:
        parser = super().init_parser(**kwargs)
        parser.__class__ = ShortUsageParser  # the same parser, with the short usage line
        return parser

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--threads",
            type=PositiveInt | None,
            default=None,
            help="PyTorch's intra-op threads (default: chosen from the cores other processes leave free, "
            "and followed while training; or OMP_NUM_THREADS when set; docs/PERFORMANCE.md, Threads)",
        )
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

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        self._check_decoder_keys(config.get("model.decoder"), subcommand)

    def _check_decoder_keys(self, decoder, subcommand: str | None) -> None:
        """``--model.decoder.KEY`` for a KEY no decoder kind has: the parser's one-line error for an
        unrecognized argument, with the nearest key ("did you mean --model.decoder.hidden_dim?"). The
        decoder's settings are a mapping to the parser (its kind chooses which: models/kinds.py)."""
        import dataclasses

        from captioning.common import did_you_mean
        from captioning.models.kinds import DECODERS, list_decoders

        plain = decoder.as_dict() if isinstance(decoder, Namespace) else decoder
        if not isinstance(plain, dict):
            return
        known = {f.name for kind in list_decoders() for f in dataclasses.fields(DECODERS.get(kind))}
        unknown = [k for k in plain if k not in known]
        if not unknown:
            return
        flag = f"--model.decoder.{unknown[0]}"
        given = next((f"{a} {b}" for a, b in zip(sys.argv, sys.argv[1:] + [""]) if a == flag), flag)
        hint = did_you_mean([flag], [f"--model.decoder.{k}" for k in sorted(known)])
        parser = self._subcommand_parsers.get(subcommand, self.parser)
        super(ShortUsageParser, parser).error(f"unrecognized arguments: {given}{hint}")

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
        callbacks += [RunPaths(), ValidationExamples(), PaceNote()]
        plain_output = not sys.stdout.isatty()  # a log file or CI: lines, not a repainting bar
        if (
            plain_output
            and trainer.get("enable_progress_bar") is not False
            and not any(isinstance(c, ProgressBar) for c in callbacks)
        ):
            callbacks.append(LineProgress(every=trainer.get("log_every_n_steps") or 50))
        threads = fixed_threads(config.get("threads"))  # --threads N, or OMP_NUM_THREADS
        if threads is None:
            callbacks.append(ThreadWatch())  # chooses at setup, then follows the machine's load
        else:
            torch.set_num_threads(threads)
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
    load_plugins()  # a plugin's score, decoder kind, format or objective is a value the config may name
    check_config_arguments(args if run else ["", *args])  # run=False: the arguments without a subcommand
    quiet_third_party()
    keep_freed_memory()  # the step's large tensors reuse the last step's memory (training/allocator.py)
    argv, sys.argv = sys.argv, ["captioning", *args]  # LightningCLI reads sys.argv; its usage lines name the command
    try:
        return CaptioningCLI(CaptioningModule, CaptionDataModule, run=run, save_config_kwargs={"overwrite": True})
    finally:
        sys.argv = argv
