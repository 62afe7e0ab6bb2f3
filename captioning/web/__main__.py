"""``python -m captioning.web --checkpoint CKPT [--host 127.0.0.1] [--port 7860]`` (= ``captioning serve``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from captioning.cli.options import apply_threads
from captioning.cli.serve import add_serve_arguments, cmd_serve
from captioning.errors import CaptioningError


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_serve_arguments(
        argparse.ArgumentParser(
            prog="python -m captioning.web", description="Serve models: a web page and an HTTP API (POST /api/caption)."
        )
    )
    args = parser.parse_args(argv)
    try:
        apply_threads(args)  # --threads N, or the free cores (as `captioning serve`)
        return cmd_serve(args)
    except CaptioningError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
