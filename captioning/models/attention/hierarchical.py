"""Hierarchical attention (Yang et al. 2016's HAN) on the 2-D grid, ``window: hierarchical``: cells
within regions, then regions, with the decoder's state as the query at both levels:

    alpha_i|r = normalise(e_ti, i in r)                    within each region r, from the score e_t
    s_r       = sum_{i in r} alpha_i|r a_i                 the region's vector
    u_r       = v_s^T tanh(W_s s_r + U_s h)                the region's score
    beta_r    = normalise(u_r, over the regions)
    alpha_ti  = beta_r(i) alpha_i|r(i)

Regions are ``region_size`` x ``region_size`` blocks of cells tiling the grid from its top-left
corner, numbered row by row; where the grid's side is not a multiple of the size, the last row and
column of regions are narrower (a 7x7 grid in 2x2 regions: 16 regions, the last ones 1 cell wide).
With several heads each head's alpha_i|r, s_r, u_r and beta are its own (W_s, U_s, v_s shared).
The picture's view: beta (N, R), the heads' mean.

A focus prior b_i (decoding/steering.py, added to e_ti before this window) reaches both levels:
alpha_i|r reads it with e_ti, and u_r gains the region's share of it, log mean_{i in r} exp(b_i),
because a prior that is the same over a region's cells cancels in the normalisation within it
(a region outside the box would otherwise lose nothing). Without a prior nothing changes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from captioning.common import grid_shape
from captioning.errors import ConfigError
from captioning.models.decoder import WINDOWS, per_row


def regions(gh: int, gw: int, size: int, device=None) -> Tensor:
    """(R, L) bool: cell i belongs to region r (each cell to exactly one)."""
    per_row = math.ceil(gw / size)
    rows = torch.arange(gh, device=device).repeat_interleave(gw)
    cols = torch.arange(gw, device=device).repeat(gh)
    region = (rows // size) * per_row + cols // size  # (L,)
    return torch.arange(math.ceil(gh / size) * per_row, device=device).unsqueeze(1) == region


@WINDOWS.register("hierarchical")
class HierarchicalWindow(nn.Module):
    """The region level's W_s (with its bias), U_s and v_s; the cell level is the decoder's score."""

    def __init__(self, hidden_dim: int, attention_dim: int, config, feature_dim: int | None = None):
        super().__init__()
        if feature_dim is None:
            raise ValueError("the hierarchical window needs the annotation vectors' width (feature_dim)")
        self.size = config.region_size
        self.W_s = nn.Linear(feature_dim, attention_dim)
        self.U_s = nn.Linear(hidden_dim, attention_dim, bias=False)
        bound = attention_dim**-0.5
        self.v_s = nn.Parameter(torch.empty(attention_dim).uniform_(-bound, bound))

    def forward(self, e: Tensor, h: Tensor, state, normalize) -> tuple[Tensor, Tensor]:
        """alpha_t (as e: (N, L) or (N, heads, L)) and beta (N, R)."""
        features = state.features  # (B, L, D)
        B, L = features.shape[:2]
        gh, gw = grid_shape(L)
        member = regions(gh, gw, self.size, e.device)  # (R, L)
        R = member.size(0)
        if R == 1:
            raise ConfigError(
                f"model.decoder.region_size: regions of {self.size}x{self.size} cells make one region of the "
                f"{gh}x{gw} grid; use region_size < {max(gh, gw)}"
            )
        N, k = h.size(0), e.size(1) if e.dim() == 3 else 1
        x = e.reshape(N * k, 1, L).masked_fill(~member, float("-inf"))  # (N k, R, L): each region's cells
        within = normalize(x)  # alpha_i|r, 0 outside r
        s = torch.bmm(within.view(B, -1, L).to(features.dtype), features).view(N, k, R, -1)  # s_r (N, k, R, D)
        u = torch.tanh(self.W_s(s) + self.U_s(h).view(N, 1, 1, -1)) @ self.v_s  # (N, k, R)
        if state.bias is not None:  # the focus prior's share of each region: log mean_{i in r} exp(b_i)
            b = per_row(state.bias, state.beams).unsqueeze(1).masked_fill(~member, float("-inf"))  # (N, R, L)
            u = u + (torch.logsumexp(b, -1) - member.sum(-1).to(b.dtype).log()).to(u.dtype).unsqueeze(1)
        beta = normalize(u)
        alpha = (beta.view(N * k, R, 1) * within).sum(1)  # beta_r(i) alpha_i|r(i): one region per cell
        return alpha.view(e.shape), beta.mean(1)
