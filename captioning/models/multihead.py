"""Multi-head scaled dot-product attention (Vaswani et al. 2017), with Attention on Attention's
output (Huang et al. 2019) as an option: the transformer decoder's self- and cross-attention
(models/transformer.py) and the AoA grid refiner (models/decoder.py's GridRefiner)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (Vaswani et al. Eq. 1): queries (N, Tq, d) over
    keys and values (N, S, d) (from :meth:`keys_values`, computed once where they repeat), heads of
    width d / heads. With ``aoa`` the output projection is Attention on Attention's gated one."""

    def __init__(self, dim: int, heads: int, aoa: bool = False):
        super().__init__()
        self.heads, self.head_dim, self.aoa = heads, dim // heads, aoa
        self.query = nn.Linear(dim, dim)
        self.key_value = nn.Linear(dim, 2 * dim)  # [W_k | W_v]
        # W_o, or AoA's [W_i; W_g] over [v^; q] (information and gate side by side)
        self.output = nn.Linear(2 * dim, 2 * dim) if aoa else nn.Linear(dim, dim)

    def keys_values(self, x: Tensor) -> Tensor:
        """(N, S, d) -> (N, 2, S, d): the keys and values of x."""
        N, S, d = x.shape
        return self.key_value(x).view(N, S, 2, d).transpose(1, 2)

    def forward(
        self, x: Tensor, kv: Tensor, mask: Tensor | None = None, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """x (N, Tq, d), kv (N, 2, S, d), mask broadcastable to (N, heads, Tq, S), True where a query
        may look; ``bias`` broadcastable to it, added to the scores before the softmax (a prior over
        the keys: decoding/steering.py's focus) -> the output (N, Tq, d) and the weights (N, heads, Tq, S)."""
        N, Tq, d = x.shape
        S = kv.size(2)
        q = self.query(x).view(N, Tq, self.heads, self.head_dim).transpose(1, 2)  # (N, h, Tq, dh)
        k, v = kv.view(N, 2, S, self.heads, self.head_dim).transpose(2, 3).unbind(1)  # (N, h, S, dh) each
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (N, h, Tq, S)
        if bias is not None:
            scores = scores + bias
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(-1)
        attended = (weights @ v).transpose(1, 2).reshape(N, Tq, d)  # the heads joined: v^
        if self.aoa:
            return F.glu(self.output(torch.cat([attended, x], -1)), -1), weights  # i * sigmoid(g)
        return self.output(attended), weights
