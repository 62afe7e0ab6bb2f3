"""The steering flags of ``caption`` and ``attend``: ``--focus x0,y0,x1,y1`` and ``--focus-strength S``
(decoding/steering.py; ``--prefix`` is a decoding option of GenerationConfig)."""

from __future__ import annotations

import argparse

from captioning.cli.options import at_least


def _box(text: str):
    """An argparse type: four finite numbers x0,y0,x1,y1 (no torch imported)."""
    import math

    try:
        box = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected four numbers x0,y0,x1,y1 in the image's pixels, got {text!r}"
        ) from None
    if len(box) != 4 or not all(math.isfinite(v) for v in box):
        raise argparse.ArgumentTypeError(f"expected four finite numbers x0,y0,x1,y1, got {text!r}")
    if box[2] < box[0] or box[3] < box[1]:
        raise argparse.ArgumentTypeError(f"the box {text} is inverted (expected x0 < x1 and y0 < y1)")
    if box[2] == box[0] or box[3] == box[1]:
        raise argparse.ArgumentTypeError(f"the box {text} has zero area")
    return box


_box.__name__ = "box"


def focus_args(p: argparse.ArgumentParser) -> None:
    """Add --focus and --focus-strength to a decoding command's parser."""
    p.add_argument(
        "--focus",
        type=_box,
        default=None,
        metavar="X0,Y0,X1,Y1",
        help="describe this region: a box in the images' own pixels; a prior on the attention at every "
        "step (PyTorch models; docs/EVALUATION.md)",
    )
    p.add_argument(
        "--focus-strength",
        type=at_least(0.0, float),
        default=None,
        metavar="S",
        help="how much attention score the cells outside --focus lose (default 10; 0: no focus)",
    )


def focus_overrides(args: argparse.Namespace) -> dict:
    """The Captioner keywords of the flags: {} without --focus."""
    if getattr(args, "focus", None) is None:
        return {}
    return {"focus": args.focus, "focus_strength": args.focus_strength}


def focus_misfits(batch: list, box, problems: list) -> list:
    """--focus over many images: an image the box does not fit (outside it) becomes an error item,
    reported in ``problems`` by its file name as an unreadable image is, and the rest are captioned."""
    from captioning.data.inputs import Loaded
    from captioning.decoding.steering import check_box
    from captioning.errors import ConfigError

    kept = []
    for b in batch:
        if b.error is None:
            try:
                check_box(box, *b.image.size, "--focus", image=b.name)
            except ConfigError as e:
                problems.append((b.name, str(e)))
                b = Loaded(b.name, None, str(e))
        kept.append(b)
    return kept
