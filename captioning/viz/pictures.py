"""Attention overlays: one image per word, animated GIFs and grids.

The encoder sees the whole image stretched to a square (no crop), so grid cell (r, c) of a
(gh, gw) attention map covers rows r*H/gh .. (r+1)*H/gh and columns c*W/gw .. (c+1)*W/gw of the
original W x H image; :func:`upsample_map` stretches the map back onto it.

Styles:
* "heatmap": the attention map through a colour map, blended over the image.
* "paper": as in the paper's figures, the image fades to dark where attention is low and gets a
  light veil where it is high.
Hard attention: ``hard_cell=(row, col)`` outlines the chosen cell sharply with the soft map faint
behind it.

Only Pillow, numpy and torch are needed: a few perceptual colour maps are built in (anchor
colours, interpolated); any other name is looked up in matplotlib when it is installed.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from captioning.common import grid_shape
from captioning.viz.attention_maps import as_array, upsample_map
from captioning.viz.fonts import shown_words, text_font

Cell = Sequence[int] | int  # (row, col), or a row-major location index

# Anchor colours sampled at equal steps from matplotlib's maps (viridis, inferno, magma) and the
# classic MATLAB jet.
_COLORMAPS = {
    "inferno": [
        "#000004",
        "#1b0c42",
        "#4b0c6b",
        "#781c6d",
        "#a52c60",
        "#cf4446",
        "#ed6925",
        "#fb9a06",
        "#f7d03c",
        "#fcffa4",
    ],
    "magma": [
        "#000004",
        "#180f3e",
        "#451077",
        "#721f81",
        "#9f2f7f",
        "#cd4071",
        "#f1605d",
        "#fd9567",
        "#fec98d",
        "#fcfdbf",
    ],
    "viridis": [
        "#440154",
        "#482878",
        "#3e4a89",
        "#31688e",
        "#26828e",
        "#1f9e89",
        "#35b779",
        "#6dcd59",
        "#b4de2c",
        "#fde725",
    ],
    "jet": ["#000080", "#0000ff", "#00ffff", "#ffff00", "#ff0000", "#800000"],  # at 0, 1/8, 3/8, 5/8, 7/8, 1
    "gray": ["#000000", "#ffffff"],
}
_JET_STOPS = [0.0, 0.125, 0.375, 0.625, 0.875, 1.0]
STYLES = ("heatmap", "paper")
HIGHLIGHT = (214, 60, 0)  # the current word in a GIF frame
TEXT = (25, 25, 25)
GIF_MIN_SIDE, GIF_MAX_SIDE = 256, 640  # a GIF's picture: short side enlarged to 256 at least, long side 640 at most


# ---------------------------------------------------------------------- maps and colours
def _as_maps(maps, n: int) -> np.ndarray:
    """(T, gh, gw) array of ``n`` maps; (T, L) is reshaped to the grid of L locations (grid_shape)."""
    maps = as_array(maps)
    if maps.ndim == 2 and maps.shape[0] == n:
        maps = maps.reshape(n, *grid_shape(maps.shape[1]))
    if maps.ndim != 3 or maps.shape[0] != n:
        raise ValueError(f"expected {n} attention maps of shape (gh, gw), one per word, got shape {maps.shape}")
    return maps


def _normalise(m: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1] (as imshow does in the authors' notebook); a flat map becomes all ones."""
    lo, hi = float(m.min()), float(m.max())
    if hi - lo <= 1e-12 * max(abs(hi), 1.0):
        return np.ones_like(m)
    return (m - lo) / (hi - lo)


def colorize(values: np.ndarray, cmap: str = "inferno") -> np.ndarray:
    """(H, W) values in [0, 1] -> (H, W, 3) uint8 through a colour map.

    Built in: inferno, magma, viridis, jet, gray; other names come from matplotlib if installed.
    """
    values = np.clip(values, 0.0, 1.0)
    if cmap in _COLORMAPS:
        anchors = np.array([[int(h[i : i + 2], 16) for i in (1, 3, 5)] for h in _COLORMAPS[cmap]], dtype=np.float64)
        stops = _JET_STOPS if cmap == "jet" else np.linspace(0.0, 1.0, len(anchors))
        rgb = np.stack([np.interp(values, stops, anchors[:, k]) for k in range(3)], axis=-1)
        return np.round(rgb).astype(np.uint8)
    try:
        import matplotlib

        return (matplotlib.colormaps[cmap](values)[..., :3] * 255).round().astype(np.uint8)
    except (ImportError, KeyError):
        raise ValueError(
            f"unknown colour map {cmap!r}; built in: {sorted(_COLORMAPS)} (others need matplotlib)"
        ) from None


def _cell(cell: Cell, grid_shape: tuple[int, int]) -> tuple[int, int]:
    gh, gw = grid_shape
    row, col = divmod(int(cell), gw) if np.ndim(cell) == 0 else (int(cell[0]), int(cell[1]))
    if not (0 <= row < gh and 0 <= col < gw):
        raise ValueError(f"hard cell {(row, col)} outside the {gh}x{gw} attention grid")
    return row, col


def cell_box(cell: Cell, grid_shape: tuple[int, int], size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Pixel box [x0, y0, x1, y1) of grid cell (row, col) on a (W, H) image."""
    (row, col), (gh, gw), (width, height) = _cell(cell, grid_shape), grid_shape, size
    return (
        round(col * width / gw),
        round(row * height / gh),
        round((col + 1) * width / gw),
        round((row + 1) * height / gh),
    )


# ---------------------------------------------------------------------- one overlay
def overlay(
    image: Image.Image,
    grid_map,
    alpha: float = 0.6,
    cmap: str = "inferno",
    style: str = "heatmap",
    hard_cell: Cell | None = None,
) -> Image.Image:
    """The attention map ``grid_map`` (gh, gw) drawn over ``image`` at the image's size -> RGB image.

    ``alpha`` is the overlay's strength (0: the image alone). With ``hard_cell`` (row, col) the
    chosen cell of hard attention is shown sharply, the soft map faintly behind it.
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    image = image.convert("RGB")
    grid = as_array(grid_map)
    size = image.size  # (W, H)
    m = _normalise(upsample_map(grid, size))  # (H, W) in [0, 1]
    box = None
    if hard_cell is not None:
        x0, y0, x1, y1 = box = cell_box(hard_cell, grid.shape, size)
        chosen = np.zeros_like(m)
        chosen[y0:y1, x0:x1] = 1.0
        m = 0.3 * m + 0.7 * chosen  # the soft map faint behind the chosen cell
    base = np.asarray(image, dtype=np.float64)  # (H, W, 3)
    if style == "heatmap":
        out = (1 - alpha) * base + alpha * colorize(m, cmap)
    else:  # "paper": dim where attention is low, a white veil where it is high
        out = base * ((1 - alpha) + alpha * m)[..., None]
        out += 0.5 * alpha * m[..., None] * (255.0 - out)
    result = Image.fromarray(np.clip(out, 0, 255).round().astype(np.uint8))
    if box is not None:
        width = max(1, round(min(size) / 100))
        draw = ImageDraw.Draw(result)
        x0, y0, x1, y1 = box
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=(0, 0, 0), width=width + 1)
        draw.rectangle([x0 + 1, y0 + 1, x1 - 2, y1 - 2], outline=(255, 255, 255), width=width)
    return result


# ---------------------------------------------------------------------- layout helpers
def ui_font(size: int, texts: str | Sequence[str] = ()) -> ImageFont.ImageFont:
    """A font of ``size`` pixels for ``texts``: a CJK font where they need one (viz/fonts.py)."""
    return text_font(size, texts)


def display_size(size: tuple[int, int], min_side: int = GIF_MIN_SIDE, max_side: int = GIF_MAX_SIDE) -> tuple[int, int]:
    """(W, H) of a picture of ``size`` (W, H) scaled for display: its short side at least ``min_side``
    (small pictures are enlarged), its long side at most ``max_side``."""
    width, height = size
    scale = min(max(1.0, min_side / min(width, height)), max_side / max(width, height))
    if scale == 1.0:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def _display(image: Image.Image, min_side: int, max_side: int) -> Image.Image:
    """``image`` in RGB at :func:`display_size`."""
    image = image.convert("RGB")
    shown = display_size(image.size, min_side, max_side)
    if shown == image.size:
        return image
    return image.resize(shown, Image.Resampling.BICUBIC)


def _wrap(words: Sequence[str], font, width: int) -> list[list[int]]:
    """Greedy line breaking: lists of word indices whose text fits in ``width`` pixels."""
    words, after = shown_words(words)
    lines, line, used = [], [], 0.0
    for i, word in enumerate(words):
        w = font.getlength(word)
        space = font.getlength(after[i - 1]) if line else 0.0  # none between CJK words or a word's subwords
        if line and used + space + w > width:
            lines.append(line)
            line, used, space = [], 0.0, 0.0
        used += space + w
        line.append(i)
    return lines + [line] if line else lines


def _line_height(font) -> int:
    top, bottom = font.getbbox("Hgjy|")[1::2]
    return int(bottom - top) + 4


def _caption_layout(words: Sequence[str], width: int) -> tuple[ImageFont.ImageFont, int, int, list[list[int]]]:
    """(font, padding, line height, lines of word indices) of the caption band under a ``width``-pixel
    GIF frame: the font grows with the width, the whole caption is broken into lines."""
    font = ui_font(int(np.clip(width / 14, 14, 26)), words)
    pad = max(6, width // 40)
    return font, pad, _line_height(font), _wrap(words, font, width - 2 * pad)


def caption_band(words: Sequence[str], width: int) -> int:
    """Height in pixels of the caption band :func:`render_frames` draws under a ``width``-pixel picture."""
    _, pad, line_h, layout = _caption_layout(words, width)
    return pad * 2 + line_h * max(1, len(layout))


def gif_frame_size(
    size: tuple[int, int], words: Sequence[str], min_side: int = GIF_MIN_SIDE, max_side: int = GIF_MAX_SIDE
) -> tuple[int, int]:
    """(W, H) of every frame :func:`render_frames` draws for ``words`` over a picture of ``size``
    (W, H): the picture at :func:`display_size` and the caption band under it. A GIF of T words has
    T + 1 such frames."""
    width, height = display_size(size, min_side, max_side)
    return width, height + caption_band(words, width)


def _check(words: Sequence[str], maps, hard_cells) -> tuple[np.ndarray, list]:
    words = list(words)
    maps = _as_maps(maps, len(words))
    cells = [None] * len(words) if hard_cells is None else list(hard_cells)
    if len(cells) != len(words):
        raise ValueError(f"{len(cells)} hard cells for {len(words)} words")
    return maps, cells


# ---------------------------------------------------------------------- GIF
def render_frames(
    image: Image.Image,
    words: Sequence[str],
    maps,
    hard_cells: Sequence[Cell] | None = None,
    alpha: float = 0.6,
    style: str = "heatmap",
    cmap: str = "inferno",
    min_side: int = GIF_MIN_SIDE,
    max_side: int = GIF_MAX_SIDE,
    decorate: Callable[[int | None, Image.Image], Image.Image] | None = None,
) -> list[Image.Image]:
    """T + 1 frames: for each word the overlay of its map (T, gh, gw) with the caption so far (the
    word itself highlighted) written under the image, then the plain image with the whole caption.

    The image is first scaled for display (short side >= ``min_side``, long side <= ``max_side``)
    and the overlays are computed at that size. All frames have the same size,
    :func:`gif_frame_size` (without ``decorate``). ``decorate(t, picture)``: what frame t shows of
    word t's overlay (t None: of the plain last picture), e.g. a bar beside it (viz/views.py); every
    picture it returns must have one size.
    """
    maps, cells = _check(words, maps, hard_cells)
    shown = _display(image, min_side, max_side)
    pictures = [
        overlay(shown, maps[t], alpha=alpha, cmap=cmap, style=style, hard_cell=cells[t]) for t in range(len(words))
    ]
    last = shown
    if decorate is not None:
        pictures, last = [decorate(t, p) for t, p in enumerate(pictures)], decorate(None, shown)
    width, height = last.size
    font, pad, line_h, layout = _caption_layout(words, width)  # the whole caption fixes the band's height
    band = caption_band(words, width)
    texts, after = shown_words(words)

    def frame(picture: Image.Image, upto: int, current: int | None) -> Image.Image:
        canvas = Image.new("RGB", (width, height + band), (255, 255, 255))
        canvas.paste(picture, (0, 0))
        draw = ImageDraw.Draw(canvas)
        for n, line in enumerate(layout):
            x = float(pad)
            for i in line:
                if i >= upto:
                    break
                draw.text((x, height + pad + n * line_h), texts[i], font=font, fill=HIGHLIGHT if i == current else TEXT)
                x += font.getlength(texts[i] + after[i])
        return canvas

    frames = [frame(picture, t + 1, t) for t, picture in enumerate(pictures)]
    return frames + [frame(last, len(words), None)]


def save_gif(
    image: Image.Image,
    words: Sequence[str],
    maps,
    path: str | os.PathLike,
    duration_ms: int = 800,
    hard_cells: Sequence[Cell] | None = None,
    alpha: float = 0.6,
    style: str = "heatmap",
    cmap: str = "inferno",
    **kwargs,
) -> Path:
    """Write :func:`render_frames` as a GIF that loops forever, ``duration_ms`` per frame (atomic write).

    Returns the path. ``kwargs`` go to :func:`render_frames` (min_side, max_side).
    """
    frames = render_frames(image, words, maps, hard_cells=hard_cells, alpha=alpha, style=style, cmap=cmap, **kwargs)
    return save_frames(frames, path, duration_ms)


def gif_bytes(frames: Sequence[Image.Image], duration_ms: int = 800) -> bytes:
    """Frames as the bytes of a GIF that loops forever, ``duration_ms`` per frame."""
    # an octree palette per frame: Pillow's default median cut leaves visible blotches in smooth heat maps
    frames = [f.quantize(256, method=Image.Quantize.FASTOCTREE) for f in frames]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=int(duration_ms), loop=0)
    return buffer.getvalue()


def save_frames(frames: Sequence[Image.Image], path: str | os.PathLike, duration_ms: int = 800) -> Path:
    """Write frames as a GIF that loops forever (atomic write). Returns the path."""
    from captioning.files import atomic_write_bytes

    atomic_write_bytes(path, gif_bytes(frames, duration_ms))
    return Path(path)


# ---------------------------------------------------------------------- grid
def panel_layout(n: int, cols: int) -> tuple[int, int]:
    """(rows, columns) of a grid of ``n`` panels at most ``cols`` wide."""
    cols = max(1, min(cols, n))
    return math.ceil(n / cols), cols


def render_grid(
    image: Image.Image,
    words: Sequence[str],
    maps,
    cols: int = 5,
    hard_cells: Sequence[Cell] | None = None,
    alpha: float = 0.6,
    style: str = "heatmap",
    cmap: str = "inferno",
    panel_size: int = 192,
    decorate: Callable[[int | None, Image.Image], Image.Image] | None = None,
) -> Image.Image:
    """One panel per word, its overlay titled with the word, row by row, ``cols`` panels a row.

    Each panel is the image scaled so its long side is ``panel_size`` pixels. No words (an empty
    caption): a single panel of the plain image titled "(empty caption)". ``decorate(t, panel)``:
    what word t's panel shows of its overlay (as :func:`render_frames`'s).
    """
    maps, cells = _check(words, maps, hard_cells)
    words = list(words)
    if not words:  # a model that ended at once: one panel of the plain image, not an error
        words, maps, cells = ["(empty caption)"], None, [None]
    image = image.convert("RGB")
    scale = panel_size / max(image.size)
    shown = image.resize(
        (max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.BICUBIC
    )
    panels = [
        shown if maps is None else overlay(shown, maps[t], alpha=alpha, cmap=cmap, style=style, hard_cell=cells[t])
        for t in range(len(words))
    ]
    if decorate is not None:
        panels = [decorate(None if maps is None else t, p) for t, p in enumerate(panels)]
    pw, ph = panels[0].size
    font = ui_font(int(np.clip(shown.width / 12, 12, 20)), words)
    gap, title = 8, _line_height(font) + 6
    rows, cols = panel_layout(len(words), cols)
    canvas = Image.new("RGB", (cols * (pw + gap) + gap, rows * (title + ph + gap) + gap), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for t, word in enumerate(shown_words(words)[0]):
        r, c = divmod(t, cols)
        x, y = gap + c * (pw + gap), gap + r * (title + ph + gap)
        while len(word) > 1 and font.getlength(word) > pw:
            word = word[:-2] + "\u2026"  # ellipsis
        draw.text((x + (pw - font.getlength(word)) / 2, y + 2), word, font=font, fill=TEXT)
        canvas.paste(panels[t], (x, y + title))
    return canvas


def save_grid(
    image: Image.Image,
    words: Sequence[str],
    maps,
    path: str | os.PathLike,
    cols: int = 5,
    hard_cells: Sequence[Cell] | None = None,
    alpha: float = 0.6,
    style: str = "heatmap",
    cmap: str = "inferno",
    panel_size: int = 192,
) -> Path:
    """Write :func:`render_grid` as a PNG (atomic write). Returns the path."""
    grid = render_grid(
        image, words, maps, cols=cols, hard_cells=hard_cells, alpha=alpha, style=style, cmap=cmap, panel_size=panel_size
    )
    return save_png(grid, path)


def save_png(picture: Image.Image, path: str | os.PathLike) -> Path:
    """Write a picture as a PNG (atomic write). Returns the path."""
    from captioning.files import atomic_write_bytes

    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)


def labelled_stack(pictures: Sequence[Image.Image], labels: Sequence[str], horizontal: bool) -> Image.Image:
    """Pictures side by side (``horizontal``) or one under another, each under its label
    (multi-head attention: one picture per head)."""
    font = ui_font(16, labels)
    title, gap = _line_height(font) + 8, 8
    if horizontal:
        width = sum(p.width for p in pictures) + gap * (len(pictures) - 1)
        height = title + max(p.height for p in pictures)
    else:
        width = max(p.width for p in pictures)
        height = sum(title + p.height for p in pictures) + gap * (len(pictures) - 1)
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    x = y = 0
    for picture, label in zip(pictures, labels):
        draw.text((x + 4, y + 4), label, font=font, fill=TEXT)
        canvas.paste(picture, (x, y + title))
        if horizontal:
            x += picture.width + gap
        else:
            y += title + picture.height + gap
    return canvas
