"""What a model says about the held-out colour-shape pairs of a ``test_novel`` split (data/shapes/holdout.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from captioning.data.shapes import parse_objects, record_objects
from captioning.data.shapes.holdout import Pair


def novel_pair_scores(records: Sequence, predictions: dict, holdout: Sequence[Pair] | None = None) -> dict:
    """Recall of the held-out pairs in captions of ``test_novel`` images, and the substitutions.

    ``records``: ImageRecords (with objects); ``predictions``: image_id -> caption. ``holdout``:
    the held-out pairs (default: the pairs of the records' objects that ``records`` of other splits
    never show; here: every pair of a ``test_novel`` record's objects that the caller names).
    A held-out object counts as named when the caption mentions its (size, colour, shape); else the
    caption's mention that shares its size and shape, or its size and colour, is its substitute
    (the colour, or the shape, that the model said instead); else it is missed.
    Returns {"novel_pairs", "objects", "recall", "pair_recall": {pair: recall},
    "substituted_colour": {"red circle -> blue": n}, "substituted_shape": {...}, "missed"}.
    """
    holdout = [tuple(p) for p in holdout or []]
    named, total = Counter(), Counter()
    colour_subs, shape_subs = Counter(), Counter()
    missed = 0
    for rec in records:
        if rec.image_id not in predictions:
            continue
        said = parse_objects(predictions[rec.image_id])
        unused = list(said)
        for size, colour, shape in record_objects(rec):
            if (colour, shape) not in holdout:
                continue
            key = f"{colour} {shape}"
            total[key] += 1
            if (size, colour, shape) in unused:
                unused.remove((size, colour, shape))
                named[key] += 1
                continue
            sub = next((t for t in unused if t[0] == size and t[2] == shape), None)
            if sub is not None:
                unused.remove(sub)
                colour_subs[f"{key} -> {sub[1]}"] += 1
                continue
            sub = next((t for t in unused if t[0] == size and t[1] == colour), None)
            if sub is not None:
                unused.remove(sub)
                shape_subs[f"{key} -> {sub[2]}"] += 1
                continue
            missed += 1
    n = sum(total.values())
    return {
        "novel_pairs": [f"{c}:{s}" for c, s in holdout],
        "objects": n,
        "recall": sum(named.values()) / n if n else float("nan"),
        "pair_recall": {k: named[k] / total[k] for k in sorted(total)},
        "substituted_colour": dict(colour_subs.most_common()),
        "substituted_shape": dict(shape_subs.most_common()),
        "missed": missed,
    }
