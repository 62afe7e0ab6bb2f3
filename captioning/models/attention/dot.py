"""Multiplicative scores (Luong et al. 2015, Eq. 8; Vaswani et al. 2017), ``score: dot | general | scaled_dot``:

    dot         e_ti = h^T a_i                          (needs H = D)
    general     e_ti = h^T W_a a_i
    scaled_dot  e_ti = (W_q h)^T (W_k a_i) / sqrt(A / heads)

With several heads the query and key are split into ``heads`` equal parts; head k scores with its part.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from captioning.errors import ConfigError
from captioning.models.decoder import SCORES, Score


class DotScore(Score):
    """The three scores; the subclass's ``kind`` says which."""

    kind = "dot"

    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int, heads: int = 1):
        super().__init__()
        if self.kind == "dot" and hidden_dim != feature_dim:
            raise ConfigError(
                f"model.decoder.score: 'dot' needs hidden_dim == the encoder's feature width "
                f"({hidden_dim} != {feature_dim}); use 'general' or 'scaled_dot'"
            )
        width = attention_dim if self.kind == "scaled_dot" else hidden_dim
        if width % heads:
            raise ConfigError(
                f"model.decoder.heads: the {self.kind} score's key width ({width}) must be a multiple of heads ({heads})"
            )
        self.heads = heads
        if self.kind == "general":
            self.W_a = nn.Linear(feature_dim, hidden_dim, bias=False)
        if self.kind == "scaled_dot":
            self.W_q = nn.Linear(hidden_dim, attention_dim)
            self.W_k = nn.Linear(feature_dim, attention_dim)
        self.scale = 1.0 / math.sqrt(width // heads) if self.kind == "scaled_dot" else 1.0

    def project(self, features: Tensor) -> Tensor:
        """The keys, once per batch: (B, L, D) -> (B, L, K)."""
        if self.kind == "dot":
            return features
        return self.W_a(features) if self.kind == "general" else self.W_k(features)

    def query(self, h: Tensor) -> Tensor:
        return self.W_q(h) if self.kind == "scaled_dot" else h

    def scores(self, keys: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        """keys (B, L, K), query (B * beams, K) -> e (B * beams, L), or (B * beams, heads, L)."""
        B, L, K = keys.shape
        k = self.heads
        q = query.view(B, beams, k, K // k).transpose(1, 2)  # (B, heads, beams, K / heads)
        e = torch.matmul(q, keys.view(B, L, k, K // k).permute(0, 2, 3, 1)).transpose(1, 2)  # (B, beams, heads, L)
        if self.scale != 1.0:
            e = e * self.scale
        return e.reshape(B * beams, L) if k == 1 else e.reshape(B * beams, k, L)


@SCORES.register("dot")
class Dot(DotScore):
    kind = "dot"


@SCORES.register("general")
class General(DotScore):
    kind = "general"


@SCORES.register("scaled_dot")
class ScaledDot(DotScore):
    kind = "scaled_dot"
