"""The ``captioning`` subcommands: one :class:`Command` per module under cli/, registered by name in :data:`COMMANDS`.

A new command is one module::

    @COMMANDS.register("my-command")
    class MyCommand(Command):
        help = "one line for `captioning --help`"

        def add_arguments(self, parser):
            parser.add_argument("--out", required=True, help="...")

        def run(self, args) -> int:
            from captioning.something_heavy import work  # imported when the command runs

            work(args.out)
            return 0

and its import in cli/main.py (the order of the imports is the order of ``captioning --help``'s
listing). A command module imports nothing heavy at its top: building the parser imports every
command module, and ``captioning caption --onnx`` runs where torch cannot be imported.
"""

from __future__ import annotations

import argparse

from captioning.registry import Registry


class Command:
    """A subcommand: its one-line ``help``, its flags (:meth:`add_arguments`) and what it does
    (:meth:`run`, returning the exit code). Its name is the one it is registered under.

    ``passthrough``: argparse leaves its arguments alone and :meth:`run` gets them all, the
    command's name first, as ``args.argv`` (the LightningCLI commands parse their own).
    """

    help: str = ""
    passthrough: bool = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the command's flags and positional arguments to its ``parser``."""

    def run(self, args: argparse.Namespace) -> int:
        """Do the command; the exit code (0: done; 1: done with problems, or a user error raised as a
        CaptioningError, which the entry point prints in one line)."""
        raise NotImplementedError


#: the subcommands by name; ``captioning --help`` lists them in registration order
COMMANDS: Registry[type[Command]] = Registry("command", field="captioning COMMAND")
