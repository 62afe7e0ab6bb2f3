"""Caption metrics.

* :mod:`.coco`: coco-caption scores (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE) via pycocoevalcap;
  tokenised by Java or, the same tokens without Java, by :mod:`.ptb`.
* :mod:`.ptb`: pycocoevalcap's PTB tokenisation in pure Python.
* :mod:`.cider`: CIDEr-D in process, with fixed document frequencies (self-critical rewards).
* :mod:`.objects`: object F1 of the (size, colour, shape) mentions of the shapes data.
* :mod:`.grounding`: attention correctness and the pointing game against object boxes.
* :mod:`.diversity`: distinct-n, vocabulary used, unique and novel captions, mean length.
* :mod:`.attention_health`: the attention maps' entropy and their movement between words.
* :mod:`.chair`: CHAIR-i, CHAIR-s and object recall (COCO's synonym lists; the shapes data's objects).
* :mod:`.bootstrap`: paired bootstrap intervals and permutation p-values from per-image statistics.
"""

from captioning.metrics.attention_health import AttentionHealth, attention_health
from captioning.metrics.cider import CiderD
from captioning.metrics.coco import METRICS, CocoScorer, meteor_unavailable_reason, spice_unavailable_reason
from captioning.metrics.diversity import diversity_scores
from captioning.metrics.grounding import grounding_scores
from captioning.metrics.objects import object_f1
from captioning.metrics.ptb import ptb_tokenize, tokenize_corpus

__all__ = [
    "METRICS",
    "CocoScorer",
    "CiderD",
    "meteor_unavailable_reason",
    "spice_unavailable_reason",
    "grounding_scores",
    "diversity_scores",
    "attention_health",
    "AttentionHealth",
    "object_f1",
    "ptb_tokenize",
    "tokenize_corpus",
]
