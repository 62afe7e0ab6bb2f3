"""``captioning fit | validate | test``: training and a checkpoint's scores, through LightningCLI
(training/cli.py): ``--config``, ``--print_config``, ``--model.x`` / ``--data.x`` / ``--trainer.x``."""

from __future__ import annotations

import argparse

from captioning.cli.commands import COMMANDS, Command


class LightningCommand(Command):
    """A LightningCLI subcommand: listed by ``captioning --help``; LightningCLI parses its arguments."""

    passthrough = True

    def run(self, args: argparse.Namespace) -> int:
        from captioning.training.cli import run_lightning_cli

        run_lightning_cli(args.argv)
        return 0


@COMMANDS.register("fit")
class Fit(LightningCommand):
    help = "train a model from a config (LightningCLI: `captioning fit --help`)"


@COMMANDS.register("validate")
class Validate(LightningCommand):
    help = "validation scores of a checkpoint (LightningCLI)"


@COMMANDS.register("test")
class Test(LightningCommand):
    help = "test-split scores of a checkpoint (LightningCLI)"
