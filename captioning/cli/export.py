"""``captioning export``: a checkpoint as a model folder to share (safetensors) or as ONNX graphs.

    captioning export --checkpoint best.ckpt --out model/                  # model.safetensors, config.json, vocab.json, README.md
    captioning export --checkpoint best.ckpt --out model_onnx/ --format onnx   # encoder.onnx, decoder_step*.onnx, ...

The checkpoint is read by the loader of every command (storage/load.py: a checkpoint file, a model
folder or a Hub id); the model card gets its training data, steps and best validation score, and
the test scores of an ``evaluate`` report given with ``--metrics``. storage/folder.py writes the
safetensors folder, export/onnx.py the graphs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import at_least, threads_arg
from captioning.errors import CaptioningError


def export(
    checkpoint: str, out: str, format: str = "safetensors", metrics: str | None = None, opset: int | None = None
) -> Path:
    """Write the model folder of ``checkpoint`` in ``format`` ("safetensors" or "onnx"). Returns the folder."""
    from captioning.storage.folder import metrics_card, read_metrics, save_folder
    from captioning.storage.load import load_model

    report = read_metrics(metrics)  # a bad report stops the export before the model is read
    model = load_model(checkpoint)
    card = dict(model.card, **metrics_card(report)) if report else model.card
    if format == "onnx":
        from captioning.export.onnx import OPSET, export_onnx

        return export_onnx(model, out, card, opset=opset or OPSET)
    if format != "safetensors":
        raise ValueError(f"format must be 'safetensors' or 'onnx', got {format!r}")
    return save_folder(out, model, card)


@COMMANDS.register("export")
class Export(Command):
    help = (
        "write a model folder to share (safetensors + config.json + vocab.json + "
        "model card), or ONNX graphs that caption without PyTorch"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--checkpoint", required=True, help="a checkpoint written by `captioning fit` (or a model folder)"
        )
        p.add_argument("--out", required=True, help="the model folder to write")
        p.add_argument(
            "--format",
            choices=("safetensors", "onnx"),
            default="safetensors",
            help="safetensors: weights for Captioner.from_pretrained / --checkpoint; onnx: encoder.onnx and "
            "decoder_step*.onnx for `caption --onnx` and OnnxCaptioner (default: safetensors)",
        )
        p.add_argument(
            "--metrics",
            default=None,
            help="a report of `captioning evaluate --out`: its test scores go in the model card",
        )
        p.add_argument("--opset", type=at_least(13), default=17, help="ONNX opset (with --format onnx)")
        p.add_argument("--overwrite", action="store_true", help="write into a folder that is not empty")
        threads_arg(p)

    def run(self, args: argparse.Namespace) -> int:
        from captioning.storage.folder import folder_summary

        if os.path.isfile(args.out):
            raise CaptioningError(f"--out {args.out}: a file, not a folder")
        if os.path.isdir(args.out) and any(not p.startswith(".") for p in os.listdir(args.out)) and not args.overwrite:
            raise CaptioningError(
                f"--out {args.out}: the folder exists and is not empty (pass --overwrite to write into it)"
            )
        folder = export(args.checkpoint, args.out, format=args.format, metrics=args.metrics, opset=args.opset)
        files = folder_summary(folder)
        source = os.path.getsize(args.checkpoint) if os.path.isfile(args.checkpoint) else None

        def size(n: int) -> str:
            return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"

        for name, n in files.items():
            print(f"{folder / name}\t{size(n)}")
        print(f"wrote {folder}: {size(sum(files.values()))}" + (f" (the checkpoint: {size(source)})" if source else ""))
        return 0
