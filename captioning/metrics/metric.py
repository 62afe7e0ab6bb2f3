"""The metric extension point: :class:`Metric`, what it reads (:class:`Captions`), what it gives
(:class:`MetricResult`) and the registry :data:`METRICS`.

A metric is one class registered with ``@METRICS.register("name")``. Its :meth:`Metric.score` gives
the corpus scores of a split's captions and, for ``captioning compare``, the per-image statistics
(:class:`~captioning.metrics.bootstrap.Statistic`) the paired bootstrap and the permutation test
resample, with the function that turns summed statistics back into the corpus score. A metric that
is the corpus function of per-image statistics implements :meth:`Metric.statistics` (N, K) alone
(and :meth:`Metric.corpus` when it is not their mean): the base class gives the score, the per-image
column and the statistic. ``evaluate``, ``score``, ``compare``, validation and ``captioning test``
compute every registered metric (the Evaluator: captioning/evaluation/evaluator.py); one that has
nothing to score (no attention maps, no objects) returns None.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from captioning.metrics.bootstrap import Statistic, mean_score
from captioning.registry import Registry


@dataclass
class Captions:
    """A split's captions to score and what metrics may read about them (None: not known here).

    Args:
        predictions: image_id -> the caption to score.
        references: image_id -> its reference captions (of at least every image of ``predictions``).
        records: image_id -> the scored images' ImageRecords (their objects, boxes and sizes), when
            the captions are of a dataset's split.
        images_root: the folder the records' paths are under.
        images: a function from image ids to their PIL images (CLIPScore).
        instances: image_id -> the COCO categories it holds (CHAIR's ``--instances``).
        alignments: image_id -> (words, alphas (T, L), chosen locations (T,) or None) of each decoded
            caption (grounding); head_alphas: image_id -> (T, heads, L), each head's (or an ensemble
            member's: ``parts`` "per_member") maps.
        attention: the decoded captions' attention sums (metrics/attention_health.py).
        vocab_size: the model's vocabulary size; known: the training captions as diversity compares them.
    """

    predictions: dict
    references: dict
    records: dict | None = None
    images_root: str | None = None
    images: Callable[[list], list] | None = None
    instances: Mapping | None = None
    alignments: dict | None = None
    head_alphas: dict | None = None
    parts: str = "per_head"
    attention: Any = None
    vocab_size: int | None = None
    known: Set[str] | None = None
    _shared: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        missing = [i for i in self.predictions if i not in self.references]
        if missing:
            shown = ", ".join(map(repr, missing[:10])) + (", ..." if len(missing) > 10 else "")
            raise ValueError(f"no references for {len(missing)} of the captions' images: {shown}")
        self.references = {i: self.references[i] for i in self.predictions}

    @property
    def ids(self) -> list:
        """The scored images in order: every per-image list and statistic follows it."""
        return list(self.predictions)

    def shared(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per scoring for every metric that asks by ``key`` (the coco-caption
        metrics' PTB tokens, the shapes data's parsed objects)."""
        if key not in self._shared:
            self._shared[key] = compute()
        return self._shared[key]


@dataclass
class MetricResult:
    """What a metric gives (every field optional).

    Args:
        scores: the report's corpus scores (floats; a dict for a score of several figures).
        notes: why something is missing, and what was scored ("tokens").
        statistics: name -> per-image statistics in :attr:`Captions.ids` order and their corpus
            function: what ``compare`` resamples (a name of ``scores`` unless it differs from it).
        per_image: name -> one number per image in :attr:`Captions.ids` order (``compare``'s report
            ranks images by CIDEr's).
        rows: image_id -> the columns it adds to the image's row of ``--per-image``.
        warnings: lines the Evaluator logs once per kind and keeps in the note "<metric>_warning".
    """

    scores: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    statistics: dict[str, Statistic] = field(default_factory=dict)
    per_image: dict[str, list] = field(default_factory=dict)
    rows: dict[Hashable, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def update(self, other: MetricResult) -> None:
        """Add ``other``'s entries (a later metric's) to these."""
        self.scores.update(other.scores)
        self.notes.update(other.notes)
        self.statistics.update(other.statistics)
        self.per_image.update(other.per_image)
        for i, columns in other.rows.items():
            self.rows.setdefault(i, {}).update(columns)


class Metric:
    """One metric (or a family of scores computed together), built once per Evaluator as
    ``cls(name, options)`` and asked :meth:`score` for each scoring of a split's captions.

    ``options`` holds the run's settings: "tokenizer" (the coco-caption tokens), "dominant_share"
    (diversity's warning), "clip" (a ClipScoring or None), and whatever a plugin's metric reads.
    """

    #: True: computed only when chosen (the coco-caption metrics: an Evaluator's ``metrics`` names
    #: them); False: computed wherever it has something to score
    optional: bool = False
    #: an optional metric chosen when the caller names none (SPICE is not: ``--spice``)
    default: bool = True
    #: computed in validation, each epoch (METEOR is not: it starts a JVM)
    validation: bool = True

    def __init__(self, name: str, options: Mapping[str, Any] | None = None):
        self.name = name
        self.options = dict(options or {})

    def score(self, captions: Captions) -> MetricResult | None:
        """The metric of ``captions`` (None: nothing to score). By default :meth:`corpus` of the
        summed :meth:`statistics`, each image's own as its per-image column."""
        values = self.statistics(captions)
        if values is None:
            return None
        values = np.asarray(values, dtype=np.float64).reshape(len(captions.ids), -1)  # (N, K)
        each = [float(v) for v in self.corpus(values)]  # (N,) each image's own score
        return MetricResult(
            scores={self.name: float(self.corpus(values.sum(0)))},
            statistics={self.name: Statistic(values, self.corpus)},
            per_image={self.name: each},
            rows={i: {self.name: v} for i, v in zip(captions.ids, each)},
        )

    def statistics(self, captions: Captions) -> np.ndarray | None:
        """(N, K): per image of :attr:`Captions.ids`, the statistics whose sum :meth:`corpus` turns
        into the corpus score (None: nothing to score). Needed unless :meth:`score` is overridden."""
        raise NotImplementedError(f"metric {self.name!r}: implement statistics() (and corpus()) or score()")

    def corpus(self, summed: np.ndarray) -> np.ndarray:
        """The corpus score of statistics summed over images, (..., K) -> (...); by default the mean
        of per-image scores given as (score, 1) pairs (:func:`~captioning.metrics.bootstrap.per_image_mean`)."""
        return mean_score(summed)

    def close(self) -> None:
        """Release what the metric holds (a JVM); a later :meth:`score` starts it again."""


#: the metrics, in the order of the reports' columns (captioning/metrics/__init__.py imports the built-in ones)
METRICS: Registry[type[Metric]] = Registry("metric", field="metrics")


def chosen_metrics(
    names: Sequence[str] | None = None, spice: bool = False, validation: bool = False
) -> tuple[str, ...]:
    """The registered metrics to compute, in registry order: the optional ones ``names`` chooses
    (None: those chosen by default; ``spice`` adds SPICE) and every other one; with ``validation``
    only those cheap enough for each validation. A name not registered is a one-line ConfigError."""
    chosen = {METRICS.check(n) for n in names} if names is not None else None
    if spice:
        chosen = (chosen if chosen is not None else {n for n in METRICS if METRICS.get(n).default}) | {"SPICE"}
    picked = []
    for name in METRICS:
        cls = METRICS.get(name)
        if validation and not cls.validation:
            continue
        if cls.optional and not (name in chosen if chosen is not None else cls.default):
            continue
        picked.append(name)
    return tuple(picked)


def build_metrics(names: Sequence[str], options: Mapping[str, Any] | None = None) -> list[Metric]:
    """The metrics registered under ``names``, each built with ``options``."""
    return [METRICS.get(name)(name, options) for name in names]


def list_metrics() -> dict[str, str]:
    """name -> the first paragraph of its class's docstring, for every registered metric."""
    return {name: " ".join((METRICS.get(name).__doc__ or "").strip().split("\n\n")[0].split()) for name in METRICS}
