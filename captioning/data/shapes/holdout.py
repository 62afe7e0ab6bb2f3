"""Held-out colour-shape pairs of the shapes data, and what a model says about them.

``make-shapes --holdout red:circle,blue:square`` keeps those pairs out of every training,
validation and test image (and so out of their captions) and writes a ``test_novel`` split whose
images each hold at least one of them: a test of whether a model composes a colour and a shape it
has only seen apart. :func:`~captioning.data.shapes.novel_pairs.novel_pair_scores` reads a model's captions
of that split: the share of the held-out objects it names with the right colour and shape, and
what it says instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from captioning.errors import ConfigError

NOVEL_SPLIT = "test_novel"
Pair = tuple[str, str]  # (colour, shape)


def parse_holdout(text: str | Sequence, colours: Sequence[str], shapes: Sequence[str]) -> tuple[Pair, ...]:
    """``"red:circle,blue:square"`` (or a list of such items or pairs) -> (("red", "circle"), ...).

    One line naming the item for an unknown colour or shape, a malformed item or a repeat."""
    items = [s for s in text.split(",")] if isinstance(text, str) else list(text)
    pairs: list[Pair] = []
    for item in items:
        parts = item.split(":") if isinstance(item, str) else list(item)
        parts = [str(p).strip().lower() for p in parts]
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"--holdout: {item!r} is not colour:shape (e.g. red:circle)")
        colour, shape = parts
        if colour not in colours:
            raise ConfigError(f"--holdout: unknown colour {colour!r} in {item!r}; expected one of {', '.join(colours)}")
        if shape not in shapes:
            raise ConfigError(f"--holdout: unknown shape {shape!r} in {item!r}; expected one of {', '.join(shapes)}")
        if (colour, shape) in pairs:
            raise ConfigError(f"--holdout: {colour}:{shape} is given twice")
        pairs.append((colour, shape))
    if not pairs:
        raise ConfigError("--holdout: no colour:shape pair given")
    if len(pairs) >= len(colours) * len(shapes):
        raise ConfigError("--holdout: every colour-shape pair is held out, which leaves the training split empty")
    return tuple(pairs)


def object_pairs(objects: Sequence[dict]) -> list[Pair]:
    """The (colour, shape) of each object of an image (the annotation file's ``objects``)."""
    return [(str(o["color"]), str(o["shape"])) for o in objects]


def holds_novel(objects: Sequence[dict], holdout: Sequence[Pair]) -> bool:
    """Whether any object of the image is a held-out pair."""
    return any(p in holdout for p in object_pairs(objects))


def read_holdout(annotations: str) -> tuple[Pair, ...]:
    """The held-out pairs a shapes annotation file records (its top-level ``holdout``: a list of
    "colour:shape"), else () (any other file, or a value of another form: read totally, as every JSON
    reader, files.py: read_json_file)."""
    from captioning.errors import CaptioningError
    from captioning.files import read_json_file

    if not isinstance(annotations, str):  # several files, shards: not the shapes data's one file
        return ()
    try:
        data = read_json_file(annotations, ConfigError, "a shapes annotation file")
    except CaptioningError:
        return ()
    items = data.get("holdout") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return ()
    return tuple(tuple(p.split(":", 1)) for p in items if isinstance(p, str) and p.count(":") == 1)  # type: ignore[misc]
