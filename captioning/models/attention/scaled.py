"""Scaled Luong attention (TensorFlow's ``scale=True``), ``scale: true`` on the ``dot`` or ``general`` score:

    e_ti = g h^T a_i   (dot),   e_ti = g h^T W_a a_i   (general)

g is a learned scalar initialised to 1 (the unscaled score at the start), shared by the heads: it
sets how peaked the softmax can get. Not ``scaled_dot``, whose 1 / sqrt(d) is fixed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from captioning.models.decoder import Score


class ScaledScore(Score):
    """``score``'s e times g; ``project`` and ``query`` are its own."""

    def __init__(self, score: Score):
        super().__init__()
        self.score, self.heads = score, score.heads
        self.g = nn.Parameter(torch.tensor(1.0))

    def project(self, features: Tensor) -> Tensor:
        return self.score.project(features)

    def query(self, h: Tensor) -> Tensor:
        return self.score.query(h)

    def scores(self, projected: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        return self.g * self.score.scores(projected, query, beams)


def reweighted(score: Score) -> Score:
    """The decoder's hook (models/decoder.py): ``score`` (dot or general) times a learned g."""
    return ScaledScore(score)
