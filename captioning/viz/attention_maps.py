"""Attention maps on the image: the grid of L locations and its stretch over the original image.

Encoders flatten their (gh, gw) grid row-major: location l is cell (l // gw, l % gw). The encoder
sees the whole image stretched to a square (no crop), so cell (r, c) covers rows r*H/gh ..
(r+1)*H/gh and columns c*W/gw .. (c+1)*W/gw of the original W x H image.
"""

from __future__ import annotations

import numpy as np


def as_array(x) -> np.ndarray:
    """A float64 numpy array of a tensor, array or nested list."""
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def upsample_map(grid, size: tuple[int, int]) -> np.ndarray:
    """Stretch a (gh, gw) attention map smoothly (bicubic) over a whole (W, H) image -> (H, W).

    Pixel centres are mapped as by ``align_corners=False``, so cell (r, c) lands on rows
    r*H/gh .. (r+1)*H/gh and columns c*W/gw .. (c+1)*W/gw. Bicubic overshoot is clipped at 0.
    """
    import torch
    import torch.nn.functional as F

    grid = as_array(grid)
    if grid.ndim != 2 or grid.size == 0:
        raise ValueError(f"attention map must be 2-D (gh, gw), got shape {grid.shape}")
    if not np.isfinite(grid).all():
        raise ValueError("attention map holds NaN or infinite values")
    width, height = int(size[0]), int(size[1])
    t = torch.from_numpy(grid)[None, None]  # (1, 1, gh, gw)
    up = F.interpolate(t, size=(height, width), mode="bicubic", align_corners=False)[0, 0]  # (H, W)
    return up.clamp_min_(0).numpy()
