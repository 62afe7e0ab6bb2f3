"""The ``captioning`` command: the parser built from the registered commands (cli/commands.py:
``COMMANDS``, a module per command), and the dispatch.

Training goes through LightningCLI (``fit``, ``validate``, ``test``: ``--config``, ``--print_config``,
``--model.x`` / ``--data.x`` / ``--trainer.x`` overrides); everything else is a plain subcommand.
User errors end in one line on stderr and a non-zero exit, never a traceback. The plugins
(captioning/plugins.py: ``CAPTIONING_PLUGINS``, entry points) are imported first: a plugin's command
is listed by ``--help``, and its scores, formats and metrics are there for every command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from captioning import __version__

# The built-in commands: each registers itself in COMMANDS when imported, and the order of these
# imports is the order of `captioning --help`'s listing (kept out of import sorting for that).
# isort: off
from captioning.cli import train  # noqa: F401  fit, validate, test
from captioning.cli import demo  # noqa: F401
from captioning.cli import make_shapes  # noqa: F401
from captioning.cli import caption  # noqa: F401
from captioning.cli import attend  # noqa: F401
from captioning.cli import compare_attention  # noqa: F401
from captioning.cli import atlas  # noqa: F401
from captioning.cli import evaluate  # noqa: F401
from captioning.cli import score  # noqa: F401
from captioning.cli import compare  # noqa: F401
from captioning.cli import prepare  # noqa: F401
from captioning.cli import export  # noqa: F401
from captioning.cli import serve  # noqa: F401
from captioning.cli import extract_features  # noqa: F401

# isort: on
from captioning.cli.commands import COMMANDS
from captioning.cli.options import COMMAND_BEAMS, ShortErrorParser, apply_threads
from captioning.errors import CaptioningError
from captioning.plugins import load_plugins

PREDICT_POINTER = (
    "No `predict` (LightningCLI's): caption images, folders or shards with `captioning caption IMAGES "
    f"--checkpoint CKPT` ({COMMAND_BEAMS} beams by default, the Python API 1; --num-beams), a whole split "
    "with `captioning evaluate`."
)


def predict_pointer(argv: Sequence[str]) -> str:
    """The one line that answers ``captioning predict ...``: the commands that do it, with the
    checkpoint a LightningCLI ``--ckpt_path`` named."""
    checkpoint = "CKPT"
    for i, arg in enumerate(argv):
        if arg.startswith("--ckpt_path="):
            checkpoint = arg.split("=", 1)[1]
        elif arg == "--ckpt_path" and i + 1 < len(argv):
            checkpoint = argv[i + 1]
    return (
        "`captioning predict` is not a command: caption images or folders with "
        f"`captioning caption IMAGES --checkpoint {checkpoint}`, a whole split with "
        f"`captioning evaluate --checkpoint {checkpoint} --annotations FILE --split test`"
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``captioning`` parser: a subparser per registered command, in registration order."""
    parser = ShortErrorParser(
        prog="captioning",
        description="Show, Attend and Tell image captioning.",
        epilog=PREDICT_POINTER,  # where a Lightning user looks for LightningCLI's predict
    )
    parser.add_argument("--version", action="version", version=f"captioning {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command", parser_class=ShortErrorParser)
    for name in COMMANDS:
        command = COMMANDS.get(name)()
        # a passthrough command is listed here; main() hands its arguments to it unparsed
        p = sub.add_parser(name, help=command.help, add_help=not command.passthrough)
        command.add_arguments(p)
        p.set_defaults(run=command.run, command_parser=p)
    return parser


def _captioning_cause(err: BaseException) -> CaptioningError | None:
    """The first of our own errors in ``err``'s chain of causes (None when there is none)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, CaptioningError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        load_plugins()  # before the parser: a plugin's command is one of its subcommands
        if argv and argv[0] == "predict":
            raise CaptioningError(predict_pointer(argv[1:]))
        if argv and argv[0] in COMMANDS and COMMANDS.get(argv[0]).passthrough:
            return COMMANDS.get(argv[0])().run(argparse.Namespace(command=argv[0], argv=argv))
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command's parser: its --help lists the flags the user meant
            getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
        if not getattr(args, "run", None):
            parser.print_help()
            return 2
        apply_threads(args)  # --threads N, or the free cores (cli/options.py)
        return args.run(args)
    except CaptioningError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`captioning prepare ... | head`): stop quietly, as cat does
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
        return 141  # 128 + SIGPIPE
    except Exception as err:  # e.g. jsonargparse wraps an objective's ConfigError in a ValueError of many lines
        cause = _captioning_cause(err)
        if cause is None:
            raise
        print(f"error: {cause}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
