"""Attention on Attention (Huang et al. 2019) over the LSTM decoder's context, ``aoa: true``:

    i = W_i [z^_t; h] + b_i,   g = sigmoid(W_g [z^_t; h] + b_g),   z^_t <- g * i

h is the state the placement attends from; beta_t's gate follows. (Not Cui et al.'s
attention-over-attention.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class AttentionOnAttention(nn.Module):
    def __init__(self, feature_dim: int, hidden_dim: int):
        super().__init__()
        self.W_ig = nn.Linear(feature_dim + hidden_dim, 2 * feature_dim)  # [W_i; W_g] side by side

    def forward(self, context: Tensor, h: Tensor) -> Tensor:
        """(N, D), (N, H) -> i * g (N, D)."""
        return F.glu(self.W_ig(torch.cat([context, h], -1)), -1)
