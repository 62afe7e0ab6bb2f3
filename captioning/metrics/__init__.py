"""Caption metrics.

* :mod:`.coco`: coco-caption scores (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE) via pycocoevalcap.
* :mod:`.objects`: object F1 of the (size, colour, shape) mentions of the shapes data.
* :mod:`.grounding`: attention correctness and the pointing game against object boxes.
"""
from captioning.metrics.coco import METRICS, CocoScorer, spice_unavailable_reason
from captioning.metrics.grounding import grounding_scores
from captioning.metrics.objects import object_f1

__all__ = ["METRICS", "CocoScorer", "spice_unavailable_reason", "grounding_scores", "object_f1"]
