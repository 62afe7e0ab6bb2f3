"""Caption metrics, each registered in :data:`METRICS` (:mod:`.metric`: the contract).

* :mod:`.coco`: coco-caption scores (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE) via pycocoevalcap;
  tokenised by Java or, the same tokens without Java, by :mod:`.ptb`.
* :mod:`.diversity`: distinct-n, vocabulary used, unique and novel captions, mean length.
* :mod:`.attention_health`: the attention maps' entropy and their movement between words.
* :mod:`.clip_metric`: CLIPScore and RefCLIPScore (:mod:`.clip_score` computes them).
* :mod:`.shapes_metrics`: the shapes data's object F1 (:mod:`.objects`) and attention grounding
  (:mod:`.grounding`: attention correctness and the pointing game against object boxes).
* :mod:`.chair`: CHAIR-i, CHAIR-s and object recall (COCO's synonym lists; the shapes data's objects).
* :mod:`.bootstrap`: paired bootstrap intervals and permutation p-values from per-image statistics.
* :mod:`.ptb`, :mod:`.languages`, :mod:`.cider`: the PTB tokenizer in Python, the tokens scored for
  CJK references, CIDEr-D in process (self-critical rewards).

The imports below register the built-in metrics in the order of the reports' columns.
"""

# isort: off
from captioning.metrics.metric import METRICS, Captions, Metric, MetricResult, chosen_metrics, list_metrics
from captioning.metrics.coco import COCO_METRICS, CocoScorer, meteor_unavailable_reason, spice_unavailable_reason
from captioning.metrics.diversity import diversity_scores
from captioning.metrics.attention_health import AttentionHealth, attention_health
from captioning.metrics import clip_metric  # noqa: F401
from captioning.metrics import shapes_metrics  # noqa: F401  objects, grounding
from captioning.metrics import chair  # noqa: F401

# isort: on
from captioning.metrics.cider import CiderD
from captioning.metrics.grounding import grounding_scores
from captioning.metrics.objects import object_f1
from captioning.metrics.ptb import ptb_tokenize, tokenize_corpus

__all__ = [
    "METRICS",
    "Metric",
    "MetricResult",
    "Captions",
    "chosen_metrics",
    "list_metrics",
    "COCO_METRICS",
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
