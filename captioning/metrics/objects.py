"""Object F1: the (size, colour, shape) objects a caption names against the image's objects (the
shapes data's metric "objects": metrics/shapes_metrics.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np


def object_f1(
    mentions: Mapping[Hashable, Iterable[Sequence[str]]], objects: Mapping[Hashable, Iterable[Sequence[str]]]
) -> dict:
    """Micro-averaged precision, recall and F1 of the (size, colour, shape) objects captions name.

    For every image id of ``objects`` (its ground-truth triples) the triples a predicted caption
    names (``mentions``, e.g. from ``captioning.data.shapes.parse_objects``) are matched as multisets: two "small red
    circle" mentions match at most as many small red circles as the image has. Counts are summed
    over images before dividing (micro average); a ratio with a zero denominator is 0.
    Mentions of ids that are not in ``objects`` are ignored.

    Returns {"precision", "recall", "f1", "true_positives", "predicted", "actual"}.
    """
    tp, predicted, actual = (sum(c) for c in zip((0, 0, 0), *object_counts(mentions, objects).values()))
    precision = tp / predicted if predicted else 0.0
    recall = tp / actual if actual else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "true_positives": tp,
        "predicted": predicted,
        "actual": actual,
    }


def object_counts(
    mentions: Mapping[Hashable, Iterable[Sequence[str]]], objects: Mapping[Hashable, Iterable[Sequence[str]]]
) -> dict[Hashable, tuple[int, int, int]]:
    """Per image id of ``objects``: (matched, mentioned, held) objects as :func:`object_f1` counts them
    (its micro average sums them; metrics/bootstrap.py resamples them)."""
    missing = [i for i in objects if i not in mentions]
    if missing:
        shown = ", ".join(map(repr, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise ValueError(f"object_f1: no prediction for {len(missing)} id(s): {shown}")
    counts = {}
    for i, truth in objects.items():
        said = Counter(tuple(str(w).lower() for w in t) for t in mentions[i])
        true = Counter(tuple(str(w).lower() for w in t) for t in truth)
        counts[i] = (sum((said & true).values()), sum(said.values()), sum(true.values()))
    return counts


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape), where=b > 0)


def object_score(which: str) -> Callable[[np.ndarray], np.ndarray]:
    """Micro object precision, recall or F1 from summed (matched, mentioned, held) counts (..., 3)."""

    def score(s: np.ndarray) -> np.ndarray:
        precision, recall = _ratio(s[..., 0], s[..., 1]), _ratio(s[..., 0], s[..., 2])
        if which == "precision":
            return precision
        if which == "recall":
            return recall
        return _ratio(2 * precision * recall, precision + recall)

    return score
