"""Attention health: does attention pick places, and move as the caption goes on?

Two failures show in the maps rather than in the captions: maps near uniform (the decoder reads the
mean of the image at every word) and maps that never move (the same place for every word). For
each caption's maps alpha_1..alpha_n (n tokens, EOS included; rows over L locations):

* entropy H_t = -sum_l alpha_tl log alpha_tl (nats), against the uniform map's log L: the mean
  ``attention_entropy`` and ``attention_entropy_ratio`` = mean H_t / log L (1: uniform maps);
* movement: the total-variation distance between consecutive maps, 0.5 * sum_l |alpha_{t+1,l} -
  alpha_tl| in [0, 1] (0: the same map; 1: disjoint places), its mean ``attention_movement`` over
  every consecutive pair of every caption.

:class:`AttentionHealth` gathers the sums batch by batch (numpy arrays; per caption with
:meth:`AttentionHealth.caption_sums`, so that an evaluator can count each image once).
:meth:`AttentionHealth.scores` gives the figures and a warning when the maps are near uniform (ratio above ``uniform_ratio``,
default 0.95) or barely move (movement below ``movement_floor``, default 0.05), over the maps of
at least ``min_captions`` captions (default 10: a handful says little). Training does not log them
for the sanity check's validation, before any step (training/module.py).
"""

from __future__ import annotations

import math

import numpy as np

from captioning.metrics.metric import METRICS, Captions, Metric, MetricResult

UNIFORM_RATIO = 0.95
MOVEMENT_FLOOR = 0.05
#: the fewest captions whose maps :meth:`AttentionHealth.scores` warns about
MIN_CAPTIONS = 10


class AttentionHealth:
    """Running sums of entropy and movement over captions' attention maps (see the module docstring)."""

    def __init__(
        self,
        uniform_ratio: float = UNIFORM_RATIO,
        movement_floor: float = MOVEMENT_FLOOR,
        min_captions: int = MIN_CAPTIONS,
    ):
        self.uniform_ratio, self.movement_floor, self.min_captions = uniform_ratio, movement_floor, min_captions
        self.reset()

    def reset(self) -> None:
        #: entropy summed over steps, steps, movement summed over pairs, pairs
        self.sums = np.zeros(4, dtype=np.float64)
        self.locations: int | None = None

    @staticmethod
    def caption_sums(alphas: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """(B, 4) per caption: entropy summed over its steps, its steps, movement summed over its
        consecutive pairs, its pairs. alphas (B, T, L), rows beyond a caption's length ignored; lengths (B,)."""
        a = np.clip(np.asarray(alphas, dtype=np.float64), 0.0, None)
        B, T, _ = a.shape
        valid = np.arange(T)[None, :] < np.asarray(lengths).reshape(B, 1)  # (B, T)
        entropy = -(a * np.log(np.where(a > 0, a, 1.0))).sum(-1)  # (B, T)
        moves = 0.5 * np.abs(a[:, 1:] - a[:, :-1]).sum(-1)  # (B, T-1)
        pairs = valid[:, 1:]  # both maps within the caption
        return np.stack([(entropy * valid).sum(1), valid.sum(1), (moves * pairs).sum(1), pairs.sum(1)], 1)

    def add(self, alphas: np.ndarray, lengths: np.ndarray) -> None:
        """alphas (B, T, L): each caption's maps, rows beyond its length ignored; lengths (B,)."""
        self.locations = np.shape(alphas)[-1]
        self.sums += self.caption_sums(alphas, lengths).sum(0)

    def merge(self, sums: np.ndarray, locations: int) -> None:
        """Add sums of :meth:`caption_sums` (summed over captions: e.g. those of other ranks) over maps of L = ``locations``."""
        self.sums += np.asarray(sums, dtype=np.float64)
        self.locations = locations

    def scores(self) -> tuple[dict[str, float], list[str]]:
        """(scores, warnings); no scores before a map was added."""
        entropy_sum, steps, move_sum, pairs = self.sums
        if not steps or not self.locations:
            return {}, []
        entropy = entropy_sum / steps
        uniform = math.log(self.locations) if self.locations > 1 else 1.0
        scores = {"attention_entropy": float(entropy), "attention_entropy_ratio": float(entropy / uniform)}
        warnings = []
        if steps - pairs < self.min_captions:  # each caption has one step more than its pairs: steps - pairs captions
            pairs_score = {"attention_movement": float(move_sum / pairs)} if pairs else {}
            return {**scores, **pairs_score}, warnings
        if self.locations > 1 and scores["attention_entropy_ratio"] > self.uniform_ratio:
            warnings.append(
                f"attention maps are near uniform: mean entropy {entropy:.3f} nats is "
                f"{scores['attention_entropy_ratio']:.0%} of the uniform map's log L = {uniform:.3f}"
            )
        if pairs:
            scores["attention_movement"] = float(move_sum / pairs)
            if scores["attention_movement"] < self.movement_floor:
                warnings.append(
                    f"attention barely moves between words: mean total-variation distance "
                    f"{scores['attention_movement']:.3f} < {self.movement_floor}"
                )
        return scores, warnings


def attention_health(
    maps, uniform_ratio: float = UNIFORM_RATIO, movement_floor: float = MOVEMENT_FLOOR, min_captions: int = MIN_CAPTIONS
) -> tuple[dict[str, float], list[str]]:
    """(scores, warnings) of a list of captions' maps, each (n, L) (see the module docstring)."""
    health = AttentionHealth(uniform_ratio, movement_floor, min_captions)
    for m in maps:
        m = np.asarray(m, dtype=np.float64)
        health.add(m[None], np.array([m.shape[0]]))
    return health.scores()


@METRICS.register("attention")
class AttentionMaps(Metric):
    """The decoded captions' attention entropy and movement (:class:`AttentionHealth`, gathered by
    the Evaluator as it decodes; a results file has none), and the warnings on them."""

    def score(self, captions: Captions) -> MetricResult | None:
        if captions.attention is None:
            return None
        scores, warnings = captions.attention.scores()
        return MetricResult(scores=scores, warnings=warnings) if scores else None
