"""Comparing two systems image by image: paired bootstrap intervals and permutation p-values.

Every metric ``compare`` resamples is a function of per-image statistics summed over the images
(a ratio of sums, so the same function of their mean). Each registered metric gives its statistics
(N, K) and that function (a :class:`Statistic`; captioning/metrics/metric.py), computed once per
system. A resample of the images is a vector of counts (how often each image was drawn), so a
thousand resamples are one product of a (R, N) count matrix with the (N, K) statistics.
docs/EVALUATION.md lists each built-in metric's statistics.

Paired bootstrap (Koehn 2004): the same images drawn for both systems; with several seeds per
system, the seeds are drawn too (each side's, with replacement) and the drawn seeds' statistics
summed, so the interval covers image and seed variation together. Approximate randomisation
(Riezler and Maxwell 2005): each image's statistics (a side's mean over its seeds) swapped between
the systems with probability 1/2; p = (#{|difference| >= observed} + 1) / (trials + 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class Statistic:
    """One metric's per-image statistics ``values`` (N, K) and ``score``: summed statistics (..., K) -> (...)."""

    values: np.ndarray
    score: Callable[[np.ndarray], np.ndarray]


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape), where=b > 0)


def mean_score(s: np.ndarray) -> np.ndarray:
    """The mean of per-image scores from summed (score, 1) pairs (..., 2)."""
    return _ratio(s[..., 0], s[..., 1])


def per_image_mean(values: Sequence[float]) -> np.ndarray:
    """(N, 2) statistics of a metric that is the mean of its per-image scores."""
    v = np.asarray(values, dtype=np.float64)
    return np.stack([v, np.ones_like(v)], axis=1)


def paired_bootstrap(
    a: Sequence[Statistic],
    b: Sequence[Statistic],
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """{"a", "b", "difference", "ci_low", "ci_high", "p_value"} of one metric for systems ``a`` and
    ``b``, each a list of seeds' :class:`Statistic` over the same N images in the same order.

    The difference is a - b of the corpus scores (each side's seeds pooled); the interval the
    percentile interval of the resampled differences, the p-value approximate randomisation's,
    both with ``resamples`` draws from a generator seeded by ``seed``."""
    score = a[0].score
    A = np.stack([s.values for s in a])  # (Sa, N, K)
    B = np.stack([s.values for s in b])  # (Sb, N, K)
    n = A.shape[1]
    if B.shape[1] != n:
        raise ValueError(f"paired_bootstrap: the systems cover {n} and {B.shape[1]} images; pair them first")
    va, vb = float(score(A.sum((0, 1)))), float(score(B.sum((0, 1))))
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)  # (R, N) image counts

    def side(X: np.ndarray) -> np.ndarray:  # (R, K): the resampled images' statistics of the drawn seeds
        per_seed = np.einsum("rn,snk->rsk", draws, X)
        if X.shape[0] == 1:
            return per_seed[:, 0]
        weights = rng.multinomial(X.shape[0], np.full(X.shape[0], 1.0 / X.shape[0]), size=resamples)
        return np.einsum("rs,rsk->rk", weights.astype(np.float64), per_seed)

    diffs = score(side(A)) - score(side(B))
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(diffs, [tail, 100 - tail])

    mean_a, mean_b = A.mean(0), B.mean(0)  # (N, K): a side's mean over its seeds
    observed = float(score(mean_a.sum(0)) - score(mean_b.sum(0)))
    swap = rng.random((resamples, n)) < 0.5
    delta = (mean_b - mean_a)[None]  # (1, N, K)
    sum_a = mean_a.sum(0) + np.einsum("rn,nk->rk", swap.astype(np.float64), delta[0])
    sum_b = mean_b.sum(0) - np.einsum("rn,nk->rk", swap.astype(np.float64), delta[0])
    permuted = np.abs(score(sum_a) - score(sum_b))
    extreme = int(np.sum(permuted >= abs(observed) - 1e-12))
    return {
        "a": va,
        "b": vb,
        "difference": va - vb,
        "ci_low": float(low),
        "ci_high": float(high),
        "p_value": (extreme + 1) / (resamples + 1),
    }


def compare_statistics(
    a: Sequence[Mapping[str, Statistic]],
    b: Sequence[Mapping[str, Statistic]],
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, dict]:
    """:func:`paired_bootstrap` of every metric all of ``a``'s and ``b``'s seeds have, by name;
    each metric draws its own resamples from ``seed`` (the same draws for every metric)."""
    names = [k for k in a[0] if all(k in s for s in [*a, *b])]
    return {k: paired_bootstrap([s[k] for s in a], [s[k] for s in b], resamples, seed, confidence) for k in names}
