"""The ``captioning`` command: one module per command family (main.py parses and dispatches)."""

from captioning.cli.main import build_parser, main  # noqa: F401  (the entry point, captioning.cli:main)
