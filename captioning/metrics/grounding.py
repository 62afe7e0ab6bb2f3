"""Attention grounding: does attention fall on the object a word names?

Attention correctness (Liu et al., AAAI 2017) and the pointing game (Zhang et al., ECCV 2016),
with a uniform and a centre-prior map as baselines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from captioning.viz.attention_maps import upsample_map


def _box_mask(bbox: Sequence[float], width: int, height: int) -> np.ndarray:
    """(H, W) bool: pixels whose centre lies in ``bbox`` = [x0, y0, x1, y1] (exclusive ends)."""
    x0, y0, x1, y1 = bbox
    xs, ys = np.arange(width) + 0.5, np.arange(height) + 0.5
    return ((ys >= y0) & (ys < y1))[:, None] & ((xs >= x0) & (xs < x1))[None, :]


def _center_prior(width: int, height: int) -> np.ndarray:
    """(H, W) isotropic Gaussian centred in the image, sigma = a quarter of each side, sum 1."""
    xs = (np.arange(width) + 0.5 - width / 2) / (width / 4)
    ys = (np.arange(height) + 0.5 - height / 2) / (height / 4)
    g = np.exp(-0.5 * ys[:, None] ** 2) * np.exp(-0.5 * xs[None, :] ** 2)
    return g / g.sum()


def grounding_scores(items: Iterable[tuple]) -> dict:
    """Attention correctness and pointing game of attention maps against object boxes.

    Each item is ``(grid_map, image_size, bbox)``: a non-negative (gh, gw) attention map over the
    whole image, the original image's (W, H) and the box [x0, y0, x1, y1] (pixels, exclusive
    ends; a pixel is inside when its centre is) of the object the attended word names.

    The map is upsampled to (H, W) with :func:`captioning.viz.attention_maps.upsample_map` (as the overlays
    are drawn) and normalised to sum 1 (an all-zero map counts as uniform). Then

    * attention correctness (Liu et al. 2017) = the map's mass inside the box;
    * pointing game (Zhang et al. 2016) = 1 if the map's maximum pixel (first in row-major order)
      lies in the box, else 0.

    Baselines, scored on the same boxes:

    * "uniform": a constant map. Its correctness is the box's share of the image; its maximum is
      every pixel, so its pointing score is defined as the chance that a pixel drawn at random
      hits the box, also the box's share of the image.
    * "center_prior": an isotropic Gaussian at the image centre with sigma = W/4 across and H/4
      down; it points at the image centre (a hit if the centre point lies in the box).

    Returns {"attention_correctness", "pointing_game", "count", "uniform": {...}, "center_prior":
    {...}} with means over the items (None when there are none).
    """
    rows = []  # (correctness, pointing) for: attention, uniform, centre prior
    for grid, (width, height), bbox in items:
        width, height = int(width), int(height)
        m = upsample_map(grid, (width, height))  # (H, W)
        total = m.sum()
        m = m / total if total > 0 else np.full_like(m, 1.0 / m.size)
        inside = _box_mask(bbox, width, height)  # (H, W)
        share = inside.mean()
        prior = _center_prior(width, height)
        x0, y0, x1, y1 = bbox
        centre_hit = float(x0 <= width / 2 < x1 and y0 <= height / 2 < y1)
        rows.append((m[inside].sum(), float(inside.flat[m.argmax()]), share, share, prior[inside].sum(), centre_hit))

    def mean(column: int) -> float | None:
        return float(np.mean([r[column] for r in rows])) if rows else None

    return {
        "attention_correctness": mean(0),
        "pointing_game": mean(1),
        "count": len(rows),
        "uniform": {"attention_correctness": mean(2), "pointing_game": mean(3)},
        "center_prior": {"attention_correctness": mean(4), "pointing_game": mean(5)},
    }
