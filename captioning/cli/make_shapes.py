"""``captioning make-shapes``: the synthetic shapes dataset (data/shapes/__init__.py)."""

from __future__ import annotations

import argparse

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import at_least


@COMMANDS.register("make-shapes")
class MakeShapes(Command):
    help = "generate the synthetic shapes dataset"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", required=True, help="folder for dataset_shapes.json and images/")
        p.add_argument("--train", type=at_least(1), default=4000, help="training images")
        p.add_argument("--val", type=at_least(1), default=200, help="validation images")
        p.add_argument("--test", type=at_least(1), default=300, help="test images")
        p.add_argument("--seed", type=int, default=0, help="random seed")
        p.add_argument("--image-size", type=at_least(16), default=64, help="side of the square images, in pixels")
        p.add_argument(
            "--preset",
            choices=("demo", "hard"),
            default="demo",
            help="demo: 1-4 objects on a gradient, PNG (the demo's data); hard: 2-4 objects of 3 sizes, "
            "8 colours, 6 shapes on textured backgrounds, JPEG",
        )
        p.add_argument(
            "--language",
            choices=("en", "zh"),
            default="en",
            help="the captions' language: en, or zh (Chinese: the same images; docs/LANGUAGES.md)",
        )
        p.add_argument(
            "--holdout",
            default="",
            help="colour:shape pairs kept out of train/val/test images and captions, comma-separated "
            "(e.g. red:circle,blue:square); their images form a test_novel split (docs/EVALUATION.md)",
        )
        p.add_argument(
            "--test-novel", type=at_least(1), default=None, help="test_novel images with --holdout (default: --test)"
        )

    def run(self, args: argparse.Namespace) -> int:
        from captioning.data.shapes import generate

        path = generate(
            args.out,
            n_train=args.train,
            n_val=args.val,
            n_test=args.test,
            seed=args.seed,
            image_size=args.image_size,
            preset=args.preset,
            holdout=args.holdout,
            n_test_novel=args.test_novel,
            language=args.language,
        )
        print(f"wrote {path}")
        return 0
