"""Attention pooling (the text classifiers' attention; Yang et al. 2016) for the initial state,
``init: attention_pool``:

    u_i = tanh(W a_i + b),   alpha_i = softmax(u_i^T u_w),   s = sum_i alpha_i a_i
    h_0, c_0 = tanh(W_init s)                                   (the decoder's initial_state)

u_w is a learned vector, the same for every image: the state starts from the locations it
learns to find informative instead of their mean (the paper's Section 3.1.2).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class AttentionPool(nn.Module):
    def __init__(self, feature_dim: int, attention_dim: int):
        super().__init__()
        self.W = nn.Linear(feature_dim, attention_dim)  # W and b
        bound = attention_dim**-0.5
        self.u_w = nn.Parameter(torch.empty(attention_dim).uniform_(-bound, bound))

    def weights(self, features: Tensor) -> Tensor:
        """alpha (B, L) from the annotation vectors (B, L, D)."""
        return torch.softmax(torch.tanh(self.W(features)) @ self.u_w, -1)

    def forward(self, features: Tensor) -> Tensor:
        """s (B, D)."""
        return torch.bmm(self.weights(features).unsqueeze(1), features).squeeze(1)
