"""Attention GIFs within a pixel budget.

A GIF of T words is T + 1 frames of the picture and the caption band under it; its cost, in
memory and in drawing time, is frames x width x height. :func:`budgeted_gif` keeps that under the
server's ``--max-gif-pixels``: the frames are measured with the same functions that draw them
(:func:`captioning.viz.pictures.display_size`, :func:`captioning.viz.pictures.caption_band`), and a
GIF over the budget is drawn from a smaller picture, or left out when it would have to be smaller
than :data:`MIN_GIF_SIDE`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from PIL import Image

from captioning.viz import pictures

DEFAULT_GIF_PIXELS = 8_000_000  # frames x width x height of one GIF at most
MIN_GIF_SIDE = 48  # a GIF is never shrunk below this long side to fit the budget; it is left out instead
SHRINK_TRIES = 8  # the caption band's height depends on the width: shrinking converges in a few steps
SHRINK_MARGIN = 0.98  # each step aims 2% under the budget: the caption band does not shrink with the width


def budgeted_gif(
    image: Image.Image, words: Sequence[str], maps, hard_cells: Sequence | None, max_pixels: int = DEFAULT_GIF_PIXELS
) -> tuple[bytes | None, dict]:
    """The attention GIF of ``words`` and their ``maps`` (T, gh, gw) over ``image`` within
    ``max_pixels`` (frames x width x height, the caption band included), and its description
    ``{"frames", "width", "height", "shrunk", "budget_pixels"}``.

    Within the budget the frames are those :func:`~captioning.viz.pictures.render_frames` draws at
    its default sizes (as ``Captioner.render`` does); over it the picture is shrunk until the frames
    fit; when they would have to be smaller than :data:`MIN_GIF_SIDE`, no GIF (None) and
    ``"left_out"`` says why.
    """
    frames = len(words) + 1
    width, height = pictures.display_size(image.size)
    info: dict[str, Any] = {"frames": frames, "budget_pixels": int(max_pixels), "shrunk": False}
    for _ in range(SHRINK_TRIES):
        total = frames * width * (height + pictures.caption_band(words, width))
        if total <= max_pixels:
            break
        fit = math.sqrt(max_pixels / total) * SHRINK_MARGIN
        width, height = max(1, int(width * fit)), max(1, int(height * fit))
        info["shrunk"] = True
    if total > max_pixels or max(width, height) < MIN_GIF_SIDE:
        info["left_out"] = (
            f"{frames} frames do not fit the server's GIF budget of {max_pixels:,} pixels at {MIN_GIF_SIDE} px or more"
        )
        return None, info
    if info["shrunk"]:
        image = image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
    # min_side and max_side of the picture's own size: drawn at (width, height), not scaled again
    drawn = pictures.render_frames(
        image, words, maps, hard_cells=hard_cells, min_side=min(width, height), max_side=max(width, height)
    )
    info["width"], info["height"] = drawn[0].size
    return pictures.gif_bytes(drawn), info
