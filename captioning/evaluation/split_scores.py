"""Scoring a dataset split's captions: :func:`score_split`, the one path of ``captioning evaluate``
(a model's captions), ``score`` and ``compare`` (a results file's), and what it gives,
:class:`SplitScores` (the report's scores and notes, the per-image rows of ``--per-image`` and the
statistics ``compare`` resamples); what an evaluator reads of a CaptionData (its training captions,
its images)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from captioning.errors import AnnotationError
from captioning.evaluation.evaluator import Evaluator
from captioning.evaluation.results_files import dataset_ids
from captioning.metrics.diversity import known_captions


def training_captions(data) -> list[str] | None:
    """The training split's references of a CaptionData (for the share of novel captions); None
    without a training split."""
    try:
        return [c for r in data.records("train") for c in r.captions]
    except AnnotationError:
        return None


def known_training_captions(data) -> frozenset[str] | None:
    """:func:`training_captions` as the novelty score compares them (``known_captions``): one set
    that several evaluators can share; None without a training split."""
    captions = training_captions(data)
    return None if captions is None else known_captions(captions)


def split_images(data, split: str) -> Callable[[list], list]:
    """A function from image ids of ``split`` to their PIL images as stored, read by ``data`` (from
    its files or its WebDataset shards: what CLIP scores, whatever the model was fed, cached features
    included)."""

    def images(ids: list) -> list:
        records = {r.image_id: r for r in data.records(split)}
        return [data.read_image(records[i]) for i in ids]

    return images


@dataclass
class SplitScores:
    """What :func:`score_split` gives: the report's ``scores`` and ``notes``; ``per_image``, {"ids":
    the scored images in order, and each metric's per-image numbers in that order}; ``columns``,
    image_id -> the metrics' columns of its ``--per-image`` row; ``resampled``, the statistics
    ``compare`` resamples (captioning/metrics/metric.py); ``names``, image_id -> the dataset's own id
    where it has one (:func:`~captioning.evaluation.results_files.dataset_ids`)."""

    scores: dict
    notes: dict
    per_image: dict
    columns: dict = field(default_factory=dict)
    resampled: dict = field(default_factory=dict)
    names: dict | None = None

    def rows(self, predictions: dict[int, str], references: dict) -> list[dict]:
        """One JSON-able row per scored image: its caption, references and the metrics' columns; the
        image named as the results file names it (the dataset's own id where it has one)."""
        names = self.names or {}
        return [
            {
                "image_id": names.get(i, i),
                "caption": predictions[i],
                "references": list(references[i]),
                **self.columns.get(i, {}),
            }
            for i in self.per_image.get("ids", [])
        ]

    def statistics(self) -> dict:
        """metric name -> :class:`~captioning.metrics.bootstrap.Statistic` over the scored images, in
        ``per_image["ids"]`` order (what ``captioning compare`` resamples)."""
        return dict(self.resampled)


def score_split(
    evaluator: Evaluator,
    data,
    split: str,
    predictions: dict[int, str],
    instances: str | dict | None = None,
    images: Callable | None = None,
) -> SplitScores:
    """Score a split's captions: the one scoring path of ``captioning evaluate`` (a model's captions)
    and ``captioning score`` / ``compare`` (a results file's). ``data``: the split's CaptionData;
    ``predictions``: captions of images of the split (:func:`~captioning.evaluation.results_files.cover_split`);
    ``instances``: a COCO instances file for CHAIR, or what metrics/chair.py's read_instances read
    from one (the shapes data gets its CHAIR from its objects field). The scores are the
    Evaluator's: every registered metric's (:meth:`Evaluator.score_captions`)."""
    from captioning.metrics.chair import read_instances

    if instances is not None and not isinstance(instances, dict):  # a file's path
        instances = read_instances(instances)
    result = evaluator.score_captions(predictions, data.references(split), data, split, images, instances)
    return SplitScores(
        result.scores,
        result.notes,
        {"ids": list(predictions), **result.per_image} if predictions else {},
        result.rows,
        result.statistics,
        names=dataset_ids(data) or None,
    )
