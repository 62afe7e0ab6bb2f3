"""Luong et al. 2015's concat score (Eq. 8), ``score: concat``:

    e_ti = v_a^T tanh(W_a [h; a_i] + b)

The additive family under Luong's name: W_a [h; a_i] is W_a's h columns times h plus its a columns
times a_i, so the image's side is computed once per batch and the state's once per step, as for
Eq. 4. With several heads, head k scores with its own A / heads rows of W_a and its row of v_a.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.errors import ConfigError
from captioning.models.decoder import SCORES, Score


@SCORES.register("concat")
class ConcatScore(Score):
    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int, heads: int = 1):
        super().__init__()
        if attention_dim % heads:
            raise ConfigError(
                f"model.decoder.heads: attention_dim ({attention_dim}) must be a multiple of heads ({heads})"
            )
        self.heads, self.hidden_dim = heads, hidden_dim
        self.W_a = nn.Linear(hidden_dim + feature_dim, attention_dim)  # W_a and b, over [h; a_i]
        bound = (heads / attention_dim) ** 0.5
        self.v_a = nn.Parameter(torch.empty(heads, attention_dim // heads).uniform_(-bound, bound))

    def project(self, features: Tensor) -> Tensor:
        """W_a's a columns times a_i, plus b: (B, L, D) -> (B, L, A)."""
        return F.linear(features, self.W_a.weight[:, self.hidden_dim :], self.W_a.bias)

    def query(self, h: Tensor) -> Tensor:
        """W_a's h columns times h: (N, H) -> (N, A)."""
        return F.linear(h, self.W_a.weight[:, : self.hidden_dim])

    def scores(self, projected: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        B, L, A = projected.shape
        y = torch.tanh(projected.unsqueeze(1) + query.view(B, beams, 1, A))  # (B, beams, L, A)
        e = (y.view(B, beams, L, self.heads, -1) * self.v_a).sum(-1)  # (B, beams, L, heads)
        return e.view(B * beams, L) if self.heads == 1 else e.transpose(2, 3).reshape(B * beams, self.heads, L)
