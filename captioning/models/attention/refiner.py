"""Self-attention over the grid before decoding (``refiner_layers: n``), as AoANet's refiner:

    a <- a + pos(row, col);  n times:  a <- a + Dropout(SelfAttention(LN(a))),  a <- a + Dropout(FF(LN(a)))

pre-norm Transformer encoder layers with feed-forward width 2D and 2-D sinusoidal positions;
``refiner_aoa``: each layer's self-attention output is Attention on Attention's. (B, L, D) -> (B, L, D).
The Transformer decoder (models/transformer.py) takes the same refiner.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.common import grid_shape
from captioning.errors import ConfigError
from captioning.models.multihead import MultiHeadAttention


def grid_position_embedding(gh: int, gw: int, dim: int, device=None, dtype=torch.float32) -> Tensor:
    """2-D sinusoidal position embeddings (L, dim): the first half of the channels encode the row,
    the second half the column, each as Vaswani et al.'s sin/cos pairs."""
    half = dim // 2
    freqs = torch.exp(torch.arange(0, half, 2, device=device, dtype=dtype) * (-math.log(10000.0) / half))

    def encode(pos: Tensor) -> Tensor:  # (n,) -> (n, half)
        x = pos.to(dtype).unsqueeze(1) * freqs
        return torch.stack([x.sin(), x.cos()], dim=-1).flatten(1)[:, :half]

    rows = encode(torch.arange(gh, device=device)).repeat_interleave(gw, 0)  # (L, half)
    cols = encode(torch.arange(gw, device=device)).repeat(gh, 1)
    emb = torch.cat([rows, cols], dim=1)
    return F.pad(emb, (0, dim - emb.size(1)))


def refiner(feature_dim: int, config) -> GridRefiner:
    """The refiner a decoder config asks for (``refiner_layers``, ``refiner_heads``, ``refiner_aoa``)."""
    return GridRefiner(feature_dim, config.refiner_layers, config.refiner_heads, config.dropout, config.refiner_aoa)


class GridRefiner(nn.Module):
    """``layers`` pre-norm Transformer encoder layers over a + pos (AoA's layers with ``aoa``)."""

    def __init__(self, dim: int, layers: int, heads: int, dropout: float, aoa: bool = False):
        super().__init__()
        if dim % heads:
            raise ConfigError(
                f"model.decoder.refiner_heads: the feature width ({dim}) must be a multiple of refiner_heads ({heads})"
            )
        if aoa:
            self.layers = nn.Sequential(*(AoARefinerLayer(dim, heads, dropout) for _ in range(layers)))
        else:
            layer = nn.TransformerEncoderLayer(
                dim, heads, dim_feedforward=2 * dim, dropout=dropout, batch_first=True, norm_first=True
            )
            self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, features: Tensor) -> Tensor:
        gh, gw = grid_shape(features.size(1))
        pos = grid_position_embedding(gh, gw, features.size(-1), features.device, features.dtype)
        return self.layers(features + pos)

    def maps(self, features: Tensor) -> Tensor:
        """Each layer's grid-by-grid self-attention weights (B, layers, heads, L, L), row i the weights
        location i reads every location with, for the pictures (not in the decoding path): the layers
        run as :meth:`forward` runs them, each one's attention computed again with its weights kept."""
        gh, gw = grid_shape(features.size(1))
        x = features + grid_position_embedding(gh, gw, features.size(-1), features.device, features.dtype)
        maps = []
        layers = self.layers if isinstance(self.layers, nn.Sequential) else self.layers.layers  # AoA's, or torch's
        for layer in layers:
            if isinstance(layer, AoARefinerLayer):
                y = layer.norm_attention(x)
                maps.append(layer.attention(y, layer.attention.keys_values(y))[1])
            else:  # a pre-norm nn.TransformerEncoderLayer: its self-attention reads norm1(x)
                y = layer.norm1(x)
                maps.append(layer.self_attn(y, y, y, need_weights=True, average_attn_weights=False)[1])
            x = layer(x)
        return torch.stack(maps, 1)


class AoARefinerLayer(nn.Module):
    """x + Dropout(AoA-MultiHead(LN(x))), then x + Dropout(FF(LN(x))), FF of width 2D."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.norm_attention, self.attention = nn.LayerNorm(dim), MultiHeadAttention(dim, heads, aoa=True)
        self.norm_ff = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(2 * dim, dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm_attention(x)
        x = x + self.dropout(self.attention(y, self.attention.keys_values(y))[0])
        return x + self.dropout(self.feed_forward(self.norm_ff(x)))
