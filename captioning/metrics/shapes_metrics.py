"""The shapes data's metrics: "objects" (object F1, precision and recall of the captions' (size,
colour, shape) mentions, metrics/objects.py) and "grounding" (attention on the objects the words
name, metrics/grounding.py), with what they and CHAIR read of the captions: :func:`shapes_objects`.

They read the shapes data's own parsing (captioning/data/shapes.py), which imports the scoring
modules, not this one; other data has no objects, and these metrics score nothing there.
"""

from __future__ import annotations

import numpy as np

from captioning.metrics.bootstrap import Statistic
from captioning.metrics.metric import METRICS, Captions, Metric, MetricResult
from captioning.metrics.objects import object_counts, object_f1, object_score


def shapes_objects(captions: Captions) -> tuple[dict, dict]:
    """(mentions, truth) of the scored images whose records list their objects (the shapes data):
    image_id -> the (size, colour, shape) triples its caption names, and those it holds; ({}, {})
    for other data. Parsed once per scoring for every metric that asks (object F1, CHAIR)."""

    def parse() -> tuple[dict, dict]:
        from captioning.data.shapes import parse_objects, record_objects

        records = captions.records or {}
        truth = {i: record_objects(r) for i, r in records.items() if r.objects}
        return {i: parse_objects(captions.predictions[i]) for i in truth}, truth

    return captions.shared("shapes_objects", parse)


@METRICS.register("objects")
class ObjectScores(Metric):
    """Object F1, precision and recall of the shapes data's (size, colour, shape) mentions
    (micro averages); compare resamples the matched, mentioned and held objects per image."""

    def score(self, captions: Captions) -> MetricResult | None:
        mentions, truth = shapes_objects(captions)
        if not truth:
            return None
        f1 = object_f1(mentions, truth)
        counts = object_counts(mentions, truth)
        result = MetricResult(
            scores={"object_f1": f1["f1"], "object_precision": f1["precision"], "object_recall": f1["recall"]}
        )
        for i, (tp, said, held) in counts.items():
            result.rows[i] = {
                "object_f1": 2 * tp / (said + held) if said + held else 0.0,
                "objects_matched": tp,
                "objects_mentioned": said,
                "objects_held": held,
            }
        if all(i in counts for i in captions.ids):
            values = np.asarray([counts[i] for i in captions.ids], dtype=np.float64)  # (N, 3)
            for which in ("f1", "precision", "recall"):
                result.statistics[f"object_{which}"] = Statistic(values, object_score(which))
        return result


@METRICS.register("grounding")
class Grounding(Metric):
    """Attention grounding of the decoded words that name an object of the image (its box), when the
    Evaluator keeps the captions' maps (``evaluate --grounding``); with several heads (an
    ensemble's members) each one's maps too."""

    def score(self, captions: Captions) -> MetricResult | None:
        records = captions.records or {}
        if captions.alignments is None or not any(r.objects for r in records.values()):
            return None
        from captioning.data.shapes import grounding

        scores = grounding(records, captions.alignments, captions.images_root)
        if captions.head_alphas:  # the mean of the heads' (members') maps above; each one's own here
            heads = next(iter(captions.head_alphas.values())).shape[1]
            scores[captions.parts] = [
                grounding(
                    records,
                    {
                        i: (words, captions.head_alphas[i][:, k], None)
                        for i, (words, _, _) in captions.alignments.items()
                    },
                    captions.images_root,
                )
                for k in range(heads)
            ]
        return MetricResult(scores={"grounding": scores})
