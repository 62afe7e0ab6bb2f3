"""Sparsemax (Martins and Astudillo 2016), Eq. 5's normaliser with ``normalizer: sparsemax``: the
Euclidean projection of the scores z onto the probability simplex,

    z_(1) >= ... >= z_(L) sorted,   k(z) = max {k : 1 + k z_(k) > sum_{j <= k} z_(j)}
    tau(z) = (sum_{j <= k(z)} z_(j) - 1) / k(z),   sparsemax_i(z) = max(z_i - tau(z), 0)

Weights below the threshold tau are exactly zero. Over the last dimension, so (N, L) and
(N, heads, L) alike; -inf scores (a window's outside) get zero. Written in differentiable
operations: autograd's gradient is the paper's closed form, on the support S dL/dz = g - mean_S g,
and 0 off it (k(z) is piecewise constant, and tau depends on the sorted scores of the support only).
"""

from __future__ import annotations

import torch
from torch import Tensor

from captioning.models.decoder import NORMALIZERS


def sparsemax(z: Tensor) -> Tensor:
    """sparsemax over the last dimension (computed at least in float32, returned in z's dtype)."""
    dtype, z = z.dtype, z.to(torch.promote_types(z.dtype, torch.float32))
    z_sorted = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, device=z.device, dtype=z.dtype)
    cumulative = z_sorted.cumsum(-1)
    k_z = (1 + k * z_sorted > cumulative).sum(-1, keepdim=True)  # the support is a prefix of the sorted scores
    tau = (cumulative.gather(-1, k_z - 1) - 1) / k_z.to(z.dtype)
    return torch.relu(z - tau).to(dtype)  # relu: no gradient where z_i = tau, outside the support


NORMALIZERS.add("sparsemax", sparsemax)
