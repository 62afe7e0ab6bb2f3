"""Diversity of a split's captions: do the images get captions of their own, in words of their own?

A model that writes "a man riding a horse" for half the images may still score well on BLEU; these
figures show it (Li et al. 2016 for distinct-n; Dai et al. 2017, Shetty et al. 2017 for the share
of unique and novel captions). Captions are compared as their lower-cased words
(:func:`captioning.tokenizers.tokenize`, no nltk), so "A dog." and "a dog" are the same caption; captions mostly in
CJK characters as the words the scores count (jieba's, metrics/languages.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Set

from captioning.metrics.metric import METRICS, Captions, Metric, MetricResult
from captioning.tokenizers import tokenize
from captioning.vocab import Vocabulary

#: the share of images one caption may cover before :func:`diversity_scores` warns
DOMINANT_SHARE = 0.2
#: the fewest images whose captions :func:`diversity_scores` warns about: on fewer, one repeated
#: caption is a large share by chance ("25%" of 4 images)
MIN_IMAGES = 10


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def _split(captions: list[str]) -> list[list[str]]:
    """The words of each caption: lower-cased words, or the language's words for CJK captions."""
    from captioning.metrics.languages import scoring_tokenizer

    language = scoring_tokenizer(captions)
    return [(language.tokenize if language is not None else tokenize)(c) for c in captions]


def known_captions(captions: Iterable[str]) -> frozenset[str]:
    """Captions as :func:`diversity_scores` compares them (their lower-cased words), for ``known``."""
    return frozenset(" ".join(words) for words in _split(list(captions)))


def diversity_scores(
    captions: Mapping[int, str],
    vocab_size: int | None = None,
    training_captions: Iterable[str] | None = None,
    dominant_share: float = DOMINANT_SHARE,
    known: Set[str] | None = None,
    min_images: int = MIN_IMAGES,
) -> tuple[dict[str, float], list[str]]:
    """(scores, warnings) of ``captions`` (image_id -> caption), one caption per image.

    Scores (floats, shares in [0, 1]):

    * ``distinct_1``, ``distinct_2``: distinct n-grams over all n-grams of all captions (corpus level);
    * ``vocabulary_used``: the number of distinct words; ``vocabulary_share``: that over the
      model's words (``vocab_size`` less the 4 special tokens; only when ``vocab_size`` is given);
    * ``unique_captions``: the share of images whose caption no other image has;
    * ``distinct_captions``: distinct captions over images (1: every caption differs);
    * ``top_caption_share``: the share of images given the most frequent caption;
    * ``novel_captions``: the share of captions found in none of ``training_captions`` (only when
      given; or in none of ``known``, the same captions through :func:`known_captions`, computed once);
    * ``mean_length``: words per caption.

    Warnings: one line when one caption covers more than ``dominant_share`` of the images, given
    to at least two of them among at least ``min_images`` (:data:`MIN_IMAGES`) images.
    """
    if not captions:
        return {}, []
    words = _split(list(captions.values()))
    texts = [" ".join(w) for w in words]
    counts = Counter(texts)
    scores: dict[str, float] = {}
    for n in (1, 2):
        grams = [g for w in words for g in _ngrams(w, n)]
        scores[f"distinct_{n}"] = len(set(grams)) / len(grams) if grams else 0.0
    used = {w for ws in words for w in ws}
    scores["vocabulary_used"] = float(len(used))
    if vocab_size is not None:
        scores["vocabulary_share"] = len(used) / max(vocab_size - len(Vocabulary.SPECIALS), 1)
    scores["unique_captions"] = sum(1 for t in texts if counts[t] == 1) / len(texts)
    scores["distinct_captions"] = len(counts) / len(texts)
    top, top_count = counts.most_common(1)[0]
    scores["top_caption_share"] = top_count / len(texts)
    if known is None and training_captions is not None:
        known = known_captions(training_captions)
    if known is not None:
        scores["novel_captions"] = sum(1 for t in texts if t not in known) / len(texts)
    scores["mean_length"] = sum(map(len, words)) / len(words)
    warnings = []
    if scores["top_caption_share"] > dominant_share and top_count >= 2 and len(texts) >= min_images:
        warnings.append(
            f"one caption covers {scores['top_caption_share']:.0%} of the images (more than "
            f"{dominant_share:.0%}): {_shortened(top)!r}"
        )
    return scores, warnings


def _shortened(text: str, limit: int = 60) -> str:
    """``text``, or its first ``limit`` characters and "..." (a degenerate caption can be 30 words long)."""
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


@METRICS.register("diversity")
class Diversity(Metric):
    """distinct-1/2, vocabulary used, unique, distinct, top and novel captions, mean length
    (:func:`diversity_scores`); the warning when one caption covers too many images. The option
    "dominant_share" sets that share."""

    def score(self, captions: Captions) -> MetricResult:
        scores, warnings = diversity_scores(
            captions.predictions,
            captions.vocab_size,
            dominant_share=self.options.get("dominant_share", DOMINANT_SHARE),
            known=captions.known,
        )
        return MetricResult(scores=scores, warnings=warnings)
