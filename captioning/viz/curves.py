"""Training curves as one picture: a run's logged scalars (TensorBoard event files) drawn with Pillow.

    plot_curves("outputs/demo/train/lightning_logs/version_0", "outputs/demo/curves.png")

Each panel is one scalar against the training step: the training loss (with its running mean)
and the validation scores the run logged (CIDEr, BLEU-4 and, on the shapes data, object F1). A
scalar logged fewer than MIN_POINTS times is named with its values instead of drawn.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from captioning.common import PathLike
from captioning.errors import ConfigError

PANELS = (
    ("train/loss", "training loss"),
    ("val/CIDEr", "validation CIDEr"),
    ("val/BLEU-4", "validation BLEU-4"),
    ("val/object_f1", "validation object F1"),
)


def read_scalars(log_dir: PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """tag -> (steps, values) of every scalar in the event files of ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = os.fspath(log_dir)
    if not os.path.isdir(log_dir):
        raise ConfigError(f"{log_dir}: no such log folder")
    events = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    events.Reload()
    out = {}
    for tag in events.Tags().get("scalars", []):
        points = events.Scalars(tag)
        out[tag] = (np.array([p.step for p in points]), np.array([p.value for p in points], dtype=np.float64))
    return out


#: a panel draws a curve from this many logged points; with fewer it says so (one point of a
#: 20-step run's loss is no curve)
MIN_POINTS = 3
#: values are drawn rounded to this many decimals: differences below are float noise (a BLEU-4 of
#: 1.97e-13 against 6.2e-11 is 0 against 0, not an axis from one to the other)
DECIMALS = 6


def too_few_points(steps: np.ndarray, values: np.ndarray) -> str | None:
    """What a panel says instead of a curve of fewer than :data:`MIN_POINTS` points, or None."""
    if len(values) == 0:
        return "not logged"
    if len(values) >= MIN_POINTS:
        return None
    shown = ", ".join(f"{v:.4g} at step {int(s)}" for s, v in zip(steps, np.round(values, DECIMALS)))
    points = "1 point" if len(values) == 1 else f"{len(values)} points"
    return f"too few points for a curve\n{points}: {shown}"


def value_range(values: np.ndarray) -> tuple[float, float]:
    """The panel's vertical axis: the values' range after rounding to :data:`DECIMALS` decimals; a
    flat series gets a unit range around its value."""
    rounded = np.round(values, DECIMALS)
    lo, hi = float(rounded.min()), float(rounded.max())
    return (lo - 0.5, hi + 0.5) if hi - lo < 10.0**-DECIMALS else (lo, hi)


def _panel(
    draw: ImageDraw.ImageDraw, box: tuple, title: str, steps: np.ndarray, values: np.ndarray, smooth: bool
) -> None:
    from captioning.viz.pictures import ui_font

    x0, y0, x1, y1 = box
    font, small = ui_font(16), ui_font(12)
    draw.text((x0 + 8, y0 + 4), title, fill=(20, 20, 20), font=font)
    left, top, right, bottom = x0 + 56, y0 + 30, x1 - 12, y1 - 28
    draw.rectangle((left, top, right, bottom), outline=(170, 170, 170))
    note = too_few_points(steps, values)
    if note:
        draw.text((left + 8, top + 8), note, fill=(120, 120, 120), font=small)
        return
    values = np.round(values, DECIMALS)
    lo, hi = value_range(values)
    s0, s1 = float(steps.min()), float(max(steps.max(), steps.min() + 1))

    def xy(s, v):
        return left + (s - s0) / (s1 - s0) * (right - left), bottom - (v - lo) / (hi - lo) * (bottom - top)

    for frac in (0.0, 0.5, 1.0):
        v = lo + frac * (hi - lo)
        y = xy(s0, v)[1]
        draw.line((left - 4, y, left, y), fill=(120, 120, 120))
        draw.text((x0 + 4, y - 7), f"{v:.3g}", fill=(80, 80, 80), font=small)
    draw.text((left, bottom + 6), f"step {int(s0)}", fill=(80, 80, 80), font=small)
    draw.text((right - 80, bottom + 6), f"step {int(s1)}", fill=(80, 80, 80), font=small)
    points = [xy(s, v) for s, v in zip(steps, values)]
    colour = (70, 130, 200)
    if smooth and len(values) > 10:  # the raw loss faint, its running mean strong
        draw.line(points, fill=(180, 205, 235), width=1)
        k = max(3, len(values) // 25)
        mean = np.convolve(values, np.ones(k) / k, mode="valid")
        points = [xy(s, v) for s, v in zip(steps[k - 1 :], mean)]
    if len(points) == 1:
        px, py = points[0]
        draw.ellipse((px - 3, py - 3, px + 3, py + 3), fill=colour)
    else:
        draw.line(points, fill=colour, width=2)
        if not smooth:
            for px, py in points:
                draw.ellipse((px - 2.5, py - 2.5, px + 2.5, py + 2.5), fill=colour)


def plot_curves(
    log_dir: PathLike,
    path: PathLike | None = None,
    panels: Sequence[tuple] = PANELS,
    size: tuple[int, int] = (520, 300),
) -> Image.Image:
    """A picture of the run's curves (the panels whose scalars were logged); written to ``path`` if given."""
    from captioning.files import atomic_write_bytes

    scalars = read_scalars(log_dir)
    shown = [(tag, title) for tag, title in panels if tag in scalars] or list(panels[:1])
    cols = 2
    rows = -(-len(shown) // cols)
    width, height = size
    picture = Image.new("RGB", (cols * width, rows * height), (255, 255, 255))
    draw = ImageDraw.Draw(picture)
    empty = (np.zeros(0), np.zeros(0))
    for k, (tag, title) in enumerate(shown):
        r, c = divmod(k, cols)
        steps, values = scalars.get(tag, empty)
        _panel(
            draw,
            (c * width, r * height, (c + 1) * width, (r + 1) * height),
            title,
            steps,
            values,
            smooth=tag.startswith("train/"),
        )
    if path is not None:
        import io

        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        atomic_write_bytes(path, buffer.getvalue())
    return picture
