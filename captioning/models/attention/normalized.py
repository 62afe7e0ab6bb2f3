"""Normalised Bahdanau attention (TensorFlow's ``normalize=True``; weight normalisation, Salimans
and Kingma 2016), ``normalize: true`` on the ``additive`` or ``concat`` score:

    e_ti = g v^T / ||v|| tanh(W_a a_i + W_h h + b)         (concat: tanh(W_a [h; a_i] + b))

v is the score's own vector (Eq. 4's w, concat's v_a), g a learned scalar initialised to
sqrt(1 / A), A the attention width of a head; with several heads each head's v_k is normalised on
its own and g is shared. The scores are linear in v, so e is the score's e times g / ||v||. TF's
bias b_v outside tanh is left out: it shifts every score alike, which no normaliser here sees.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from captioning.models.decoder import AdditiveScore, Score


class NormalizedScore(Score):
    """``score``'s e with its vector v normalised and a learned g; ``project`` and ``query`` are its own."""

    def __init__(self, score: Score):
        super().__init__()
        self.score, self.heads = score, score.heads
        self.g = nn.Parameter(torch.tensor(math.sqrt(1.0 / self.v.size(1))))

    @property
    def v(self) -> Tensor:
        """The score's vector (heads, A / heads): Eq. 4's w or concat's v_a."""
        return self.score.w if isinstance(self.score, AdditiveScore) else self.score.v_a

    def project(self, features: Tensor) -> Tensor:
        return self.score.project(features)

    def query(self, h: Tensor) -> Tensor:
        return self.score.query(h)

    def scores(self, projected: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        e = self.score.scores(projected, query, beams)  # v^T tanh(.): (N, L) or (N, heads, L)
        factor = self.g / self.v.norm(dim=1)  # (heads,): g / ||v_k||
        return e * (factor if e.dim() == 2 else factor.unsqueeze(1))


def reweighted(score: Score) -> Score:
    """The decoder's hook (models/decoder.py): ``score`` (additive or concat) normalised."""
    return NormalizedScore(score)
