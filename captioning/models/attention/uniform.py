"""No attention: the fixed-context encoder-decoder the course notes start from, ``score: uniform``:

    e_ti = 0,   alpha_ti = 1 / L,   z_t = beta_t mean_i a_i

Every step reads the same context (the gate beta_t aside), however the words go: the one vector
that bottlenecks the encoder-decoder, with no alignment to look at. The scores are zeros, so any
normaliser gives 1/L (sparsemax too); a focus prior (``--focus``) is the only thing that moves them.
"""

from __future__ import annotations

from torch import Tensor

from captioning.models.decoder import SCORES, Score


@SCORES.register("uniform")
class UniformScore(Score):
    """No parameters: e_t = 0 for every location (and every head)."""

    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int, heads: int = 1):
        super().__init__()
        self.heads = heads

    def project(self, features: Tensor) -> Tensor:
        """Nothing of the image: (B, L, 0)."""
        return features.new_empty(features.shape[:2] + (0,))

    def scores(self, projected: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        B, L = projected.shape[:2]
        return projected.new_zeros((B * beams, L) if self.heads == 1 else (B * beams, self.heads, L))
