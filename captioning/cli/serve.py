"""``captioning serve``: the web page and HTTP API (the ``web`` extra); its flags and its run are
web/cli.py's (``python -m captioning.web`` runs the same command on its own)."""

from __future__ import annotations

import argparse

from captioning.cli.commands import COMMANDS, Command


@COMMANDS.register("serve")
class Serve(Command):
    help = (
        "a web page and an HTTP API to try models: upload an image, read its captions, see where the model "
        "looked (pip install -e '.[web]')"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        from captioning.web.cli import add_serve_arguments

        add_serve_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        from captioning.web.cli import cmd_serve

        return cmd_serve(args)
