"""``captioning extract-features``: a training config's frozen encoder run once over all its images
into a feature cache (the work is data/features/writer.py's; the cache's layout data/features/reader.py's)."""

from __future__ import annotations

import argparse
import json
import sys

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import at_least, threads_arg


@COMMANDS.register("extract-features")
class ExtractFeatures(Command):
    help = "run a config's frozen encoder once over all images into a feature cache"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", required=True, help="a training config: its model section picks the encoder")
        p.add_argument("--out", required=True, help="the cache folder (train with --data.features FOLDER)")
        p.add_argument("--annotations", nargs="+", default=None, help="override the config's data.annotations")
        p.add_argument("--images-root", default=None, help="override the config's data.images_root")
        p.add_argument("--split-file", default=None, help="override the config's data.split_file")
        p.add_argument("--batch-size", type=at_least(1), default=64)
        p.add_argument("--num-workers", type=at_least(0), default=4)
        p.add_argument("--shard", default="0/1", help="i/n: this process extracts every n-th image from the i-th")
        p.add_argument("--device", default=None, help="cpu, cuda, cuda:1... (default: cuda if available)")
        threads_arg(p)
        p.add_argument(
            "--dtype",
            choices=("float16", "float32"),
            default="float16",
            help="the stored type: float16 (default) halves the cache; training reads either",
        )
        p.add_argument(
            "--pool",
            type=at_least(1),
            default=None,
            metavar="N",
            help="average-pool the grid to N x N (7: a quarter of a 14x14 grid's cache); "
            "train on it with --model.encoder.grid_size N",
        )

    def run(self, args: argparse.Namespace) -> int:
        from captioning.data.features.writer import extract_from_config, parse_shard

        overrides = []
        if args.annotations:
            overrides += [
                "--data.annotations",
                args.annotations[0] if len(args.annotations) == 1 else json.dumps(args.annotations),
            ]
        if args.images_root:
            overrides += ["--data.images_root", args.images_root]
        if args.split_file:
            overrides += ["--data.split_file", args.split_file]
        report = extract_from_config(
            args.config,
            args.out,
            batch_size=args.batch_size,
            num_workers=args.num_workers,
            shard=parse_shard(args.shard),
            overrides=overrides,
            device=args.device,
            dtype=args.dtype,
            pool=args.pool,
        )
        for message in report["unreadable"]:
            print(f"unreadable: {message}", file=sys.stderr)
        print(f"{report['part']}: {report['done']} of {report['rows']} images done ({report['extracted']} this run)")
        return 0 if report["done"] == report["rows"] else 1
