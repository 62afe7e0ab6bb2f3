"""The views that teach attention, as pictures (``captioning attend --view``, ``Captioner.render(view=...)``).

* "alignment": the word-by-location matrix, words down and the grid's locations across (row by
  row), the image's cells as thumbnails along the top: the machine-translation figure.
* "self": a Transformer's word-by-word self-attention per layer and head (rows: the words written;
  columns: the words read), and a grid refiner's location-by-location self-attention.
* "gate": each word's map with a bar beside it for beta_t, the gate on the context.
* "window": each word's map with a local window's centre and extent drawn over it.
* "sample": each word's soft map beside the cell hard attention sampled from it.

The per-word views decorate the frames and panels of :mod:`captioning.viz.pictures`; the matrices are
drawn here. Pillow and numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw

from captioning.viz.fonts import shown_words
from captioning.viz.pictures import TEXT, _line_height, cell_box, labelled_stack, overlay, ui_font

#: the views, in the order ``--view`` lists them; "maps" is today's per-word maps
VIEWS = ("maps", "alignment", "self", "gate", "window", "sample")
#: views drawn as one matrix picture (PNG only): no frame per word
MATRIX_VIEWS = ("alignment", "self")
#: what a model needs for each view, for the one-line error naming the views it has
NEEDS = {
    "maps": "attention maps",
    "alignment": "attention maps",
    "self": "self-attention (a Transformer decoder's words, or a grid refiner's locations: refiner_layers >= 1)",
    "gate": "gate beta_t (the LSTM decoder's)",
    "window": "window (model.decoder.window local, local_p or local_m)",
    "sample": "sampled locations (hard attention, decoded with attention_mode sample)",
}
#: the result's views (``Captioner(..., return_views=True)``) each view reads: any one of them
READS = {
    "maps": ("alignment",),
    "alignment": ("alignment",),
    "self": ("self", "refiner"),
    "gate": ("gate",),
    "window": ("window",),
    "sample": ("sample",),
}
WINDOW_COLOUR = (0, 210, 255)
GATE_COLOUR = (214, 60, 0)
SEPARATOR = (150, 150, 150)


def offered(have: Sequence[str]) -> list[str]:
    """The views of :data:`VIEWS` a model whose results carry the arrays ``have`` can draw."""
    return [v for v in VIEWS if any(name in have for name in READS[v])]


def missing_view(view: str, have: Sequence[str], option: str = "--view") -> str | None:
    """One line saying why a model whose results carry ``have`` cannot draw ``view`` (None: it can)."""
    if view not in VIEWS:
        return f"{option}: expected one of {', '.join(VIEWS)}, got {view!r}"
    if any(name in have for name in READS[view]):
        return None
    return f"{option} {view}: this model has no {NEEDS[view]}; its views: {', '.join(offered(have)) or 'none'}"


# ---------------------------------------------------------------------- matrices
def _grey(values: np.ndarray, top: float) -> np.ndarray:
    """Weights -> grey levels, black 0 to white ``top`` (the largest weight shown)."""
    return np.clip(np.round(255 * values / max(top, 1e-12)), 0, 255).astype(np.uint8)


def _fit_text(text: str, font, width: float) -> str:
    while len(text) > 1 and font.getlength(text) > width:
        text = text[:-2] + "\u2026"
    return text


def _vertical_text(text: str, font, height: int) -> Image.Image:
    """``text`` written bottom to top in a strip ``height`` pixels tall (labels of matrix columns)."""
    text = _fit_text(text, font, height - 4)
    line = _line_height(font)
    strip = Image.new("RGB", (height, line), (255, 255, 255))
    ImageDraw.Draw(strip).text((height - 2 - font.getlength(text), 1), text, font=font, fill=TEXT)
    return strip.rotate(90, expand=True)


def alignment_picture(image: Image.Image, words: Sequence[str], maps, cell: int | None = None) -> Image.Image:
    """The word-by-location matrix: a row per word (its weights over the L locations, black 0 to
    white the matrix's largest), a column per location in row-major order, gaps between the grid's
    rows, the image's cells as thumbnails along the top. ``maps`` (T, gh, gw)."""
    maps = np.asarray(maps, dtype=np.float64)
    T, gh, gw = maps.shape
    L = gh * gw
    cell = cell or int(np.clip(1400 / L, 6, 32))
    gap = max(1, cell // 4)
    words = shown_words(list(words))[0] if T else []
    font = ui_font(int(np.clip(cell * 0.8, 11, 18)), words)
    left = int(max([font.getlength(w) for w in words] + [40])) + 12
    top_label = _line_height(font) + 4
    thumbs_y = top_label
    matrix_y = thumbs_y + cell + gap * 2
    width = left + L * cell + (gh - 1) * gap + 8
    footer = _line_height(font) * 2 + 8
    height = matrix_y + max(T, 1) * cell + footer
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    picture = image.convert("RGB")
    x_of = [left + j * cell + (j // gw) * gap for j in range(L)]
    for r in range(gh):  # the grid's row above its columns, where it fits
        label = f"row {r}"
        span = gw * cell
        if font.getlength(label) <= span:
            draw.text((x_of[r * gw] + (span - font.getlength(label)) / 2, 2), label, font=font, fill=TEXT)
    for j in range(L):
        box = cell_box(j, (gh, gw), picture.size)
        crop = picture.crop(box) if box[2] > box[0] and box[3] > box[1] else picture
        canvas.paste(crop.resize((cell, cell), Image.Resampling.BICUBIC), (x_of[j], thumbs_y))
    top = float(maps.max()) if T else 1.0
    grey = _grey(maps.reshape(T, L), top) if T else np.zeros((0, L), np.uint8)
    for t in range(T):
        y = matrix_y + t * cell
        text = _fit_text(words[t], font, left - 12)
        draw.text(
            (left - 8 - font.getlength(text), y + (cell - _line_height(font)) / 2 + 1), text, font=font, fill=TEXT
        )
        for j in range(L):
            g = int(grey[t, j])
            draw.rectangle([x_of[j], y, x_of[j] + cell - 1, y + cell - 1], fill=(g, g, g))
    note = [
        f"rows: the words; columns: the {gh} x {gw} locations, row by row (their cells above)",
        f"black 0, white {top:.3f} (the largest weight)",
    ]
    for k, line in enumerate(note):
        draw.text((8, matrix_y + max(T, 1) * cell + 4 + k * _line_height(font)), line, font=font, fill=TEXT)
    return canvas


def _matrix_panel(values: np.ndarray, top: float, cell: int, gap_every: int = 0) -> Image.Image:
    """A (R, C) matrix of weights as grey squares ``cell`` pixels wide (a 1-pixel line every
    ``gap_every`` rows and columns: the grid's rows in a location-by-location matrix)."""
    R, C = values.shape
    grey = np.repeat(np.repeat(_grey(values, top), cell, 0), cell, 1)
    panel = Image.fromarray(np.stack([grey] * 3, -1))
    if gap_every:
        draw = ImageDraw.Draw(panel)
        for k in range(gap_every, max(R, C), gap_every):
            draw.line([(0, k * cell), (C * cell, k * cell)], fill=SEPARATOR)
            draw.line([(k * cell, 0), (k * cell, R * cell)], fill=SEPARATOR)
    return panel


def _panel_grid(panels: list[list[Image.Image]], row_labels, col_labels, left: Image.Image | None = None,
                top: Image.Image | None = None, font=None) -> Image.Image:  # fmt: skip
    """Panels in rows and columns, each column titled (``col_labels``) and each row titled at its left
    (``row_labels``); ``left`` / ``top``: pictures drawn left of each row / above the first row (the
    words of a matrix)."""
    font = font or ui_font(14)
    gap, title = 10, _line_height(font) + 6
    pw, ph = panels[0][0].size
    lw = left.width + 4 if left is not None else 0
    th = top.height + 4 if top is not None else 0
    label_w = int(max(font.getlength(s) for s in row_labels)) + 12
    width = label_w + lw + len(panels[0]) * (pw + gap) + gap
    height = title + th + len(panels) * (ph + gap) + gap
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for c, label in enumerate(col_labels):
        x = label_w + lw + c * (pw + gap)
        draw.text(
            (x + max(0, (pw - font.getlength(label)) / 2), 2), _fit_text(label, font, pw + gap), font=font, fill=TEXT
        )
        if top is not None:
            canvas.paste(top, (x, title))
    for r, row in enumerate(panels):
        y = title + th + r * (ph + gap)
        draw.text((4, y + ph / 2 - _line_height(font) / 2), row_labels[r], font=font, fill=TEXT)
        if left is not None:
            canvas.paste(left, (label_w, y))
        for c, panel in enumerate(row):
            canvas.paste(panel, (label_w + lw + c * (pw + gap), y))
    return canvas


def word_self_attention_picture(words: Sequence[str], weights) -> Image.Image:
    """A Transformer's word-by-word self-attention: a T x T matrix per layer (rows of panels) and head
    (columns), row t the step that wrote ``words[t]``, column s the token it read at position s
    (``<start>``, then the caption's words); black 0, white 1. ``weights`` (T, layers, heads, >= T)."""
    weights = np.asarray(weights, dtype=np.float64)
    T, layers, heads = weights.shape[:3]
    weights = weights[..., :T]
    written = shown_words(list(words))[0] if T else []
    read = ["<start>"] + written[:-1]
    cell = int(np.clip(260 / max(T, 1), 6, 26))
    font = ui_font(int(np.clip(cell * 0.75, 10, 16)), written)
    every = max(1, -(-_line_height(font) // cell))  # a label every few rows when the rows are thinner than the text
    label_w = int(max([font.getlength(w) for w in written] + [30])) + 8
    left = Image.new("RGB", (label_w, max(T, 1) * cell), (255, 255, 255))
    draw = ImageDraw.Draw(left)
    for t in range(0, T, every):
        text = _fit_text(written[t], font, label_w - 6)
        y = max(0.0, t * cell + (cell - _line_height(font)) / 2 + 1)
        draw.text((label_w - 4 - font.getlength(text), y), text, font=font, fill=TEXT)
    top = Image.new("RGB", (max(T, 1) * cell, label_w), (255, 255, 255))
    for s in range(0, T, every):
        strip = _vertical_text(read[s], font, label_w)
        top.paste(strip, (max(0, s * cell + (cell - strip.width) // 2), 0))
    panels = [
        [
            _matrix_panel(weights[:, layer, head], 1.0, cell) if T else Image.new("RGB", (cell, cell))
            for head in range(heads)
        ]
        for layer in range(layers)
    ]
    grid = _panel_grid(panels, [f"layer {k}" for k in range(layers)], [f"head {h}" for h in range(heads)], left, top)
    return _with_note(grid, "rows: the word written; columns: the word read (<start> first); black 0, white 1")


def grid_self_attention_picture(image: Image.Image, maps) -> Image.Image:
    """A grid refiner's location-by-location self-attention: an L x L matrix per layer (rows of
    panels) and head (columns), row i the weights location i reads every location with (both in
    row-major order, a line between the grid's rows); black 0, white each panel's largest weight."""
    from captioning.common import grid_shape

    maps = np.asarray(maps, dtype=np.float64)
    layers, heads, L = maps.shape[:3]
    gh, gw = grid_shape(L)
    cell = int(np.clip(256 / L, 2, 16))
    panels = [
        [_matrix_panel(maps[layer, head], float(maps[layer, head].max()), cell, gap_every=gw) for head in range(heads)]
        for layer in range(layers)
    ]
    side = max(96, L * cell // 2)
    thumb = image.convert("RGB").resize(
        (side, max(1, round(side * image.height / image.width))), Image.Resampling.BICUBIC
    )
    grid = _panel_grid(panels, [f"layer {k}" for k in range(layers)], [f"head {h}" for h in range(heads)])
    note = (
        f"grid refiner: row i, column j = how much location i reads location j ({gh} x {gw} grid, "
        "row by row); white: each panel's largest weight"
    )
    return labelled_stack([_with_note(grid, note), thumb], ["location by location", "the image"], horizontal=True)


def _with_note(picture: Image.Image, note: str) -> Image.Image:
    font = ui_font(13, note)
    line = _line_height(font)
    width = max(picture.width, int(font.getlength(note)) + 16)
    canvas = Image.new("RGB", (width, picture.height + line + 8), (255, 255, 255))
    canvas.paste(picture, (0, 0))
    ImageDraw.Draw(canvas).text((8, picture.height + 4), note, font=font, fill=TEXT)
    return canvas


def self_attention_picture(image: Image.Image, words: Sequence[str], views: dict) -> Image.Image:
    """``views``' word-by-word ("self") and grid-by-grid ("refiner") self-attention, one under the other."""
    pictures, labels = [], []
    if views.get("self") is not None:
        pictures.append(word_self_attention_picture(words, views["self"]))
        labels.append("words: the Transformer decoder's masked self-attention")
    if views.get("refiner") is not None:
        pictures.append(grid_self_attention_picture(image, views["refiner"]))
        labels.append("locations: the grid refiner's self-attention")
    if not pictures:
        raise ValueError("no self-attention in these views (expected 'self' or 'refiner')")
    return labelled_stack(pictures, labels, horizontal=False)


# ---------------------------------------------------------------------- per-word decorations
Decorate = Callable[[int | None, Image.Image], Image.Image]


def gate_decoration(betas) -> Decorate:
    """A bar beside each word's picture, filled to beta_t (0 to 1) and labelled with it; the last
    frame's (``t`` None) bar is empty."""
    betas = np.asarray(betas, dtype=np.float64).reshape(-1)

    def decorate(t: int | None, picture: Image.Image) -> Image.Image:
        W, H = picture.size
        bar = max(28, W // 7)
        font = ui_font(int(np.clip(bar / 3, 10, 16)))
        line = _line_height(font)
        canvas = Image.new("RGB", (W + bar + 6, H), (255, 255, 255))
        canvas.paste(picture, (0, 0))
        draw = ImageDraw.Draw(canvas)
        x0, x1, y0, y1 = W + 6, W + 6 + bar - 1, line + 4, H - line - 4
        draw.rectangle([x0, y0, x1, y1], fill=(235, 235, 238), outline=(120, 120, 120))
        label = "gate"
        draw.text((x0 + (bar - font.getlength(label)) / 2, H - line - 2), label, font=font, fill=TEXT)
        if t is not None:
            beta = float(np.clip(betas[t], 0.0, 1.0))
            top = round(y1 - beta * (y1 - y0))
            if top < y1:
                draw.rectangle([x0 + 1, top, x1 - 1, y1 - 1], fill=GATE_COLOUR)
            text = f"{betas[t]:.2f}"
            draw.text((x0 + (bar - font.getlength(text)) / 2, 1), text, font=font, fill=TEXT)
        return canvas

    return decorate


def window_box(window: Sequence[float], grid: tuple[int, int], size: tuple[int, int]) -> tuple[float, ...]:
    """(x0, y0, x1, y1, cx, cy) in pixels of a window (centre row, centre column, extent: in cells,
    cell (r, c)'s centre at (r, c)) over a (W, H) picture of a (gh, gw) grid: the box spans the centre
    plus and minus the extent, in cells."""
    (row, col, extent), (gh, gw), (W, H) = window, grid, size
    sx, sy = W / gw, H / gh
    cx, cy = (col + 0.5) * sx, (row + 0.5) * sy
    return cx - extent * sx, cy - extent * sy, cx + extent * sx, cy + extent * sy, cx, cy


def window_decoration(windows, grid: tuple[int, int]) -> Decorate:
    """Each word's window drawn over its picture: the box of centre +- extent cells and the centre."""
    windows = np.asarray(windows, dtype=np.float64).reshape(-1, 3)

    def decorate(t: int | None, picture: Image.Image) -> Image.Image:
        if t is None:
            return picture
        picture = picture.copy()
        draw = ImageDraw.Draw(picture)
        x0, y0, x1, y1, cx, cy = window_box(windows[t], grid, picture.size)
        width = max(2, round(min(picture.size) / 120))
        draw.rectangle([x0, y0, x1, y1], outline=(0, 0, 0), width=width + 2)
        draw.rectangle([x0, y0, x1, y1], outline=WINDOW_COLOUR, width=width)
        r = width * 2
        draw.ellipse([cx - r - 1, cy - r - 1, cx + r + 1, cy + r + 1], fill=(0, 0, 0))
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=WINDOW_COLOUR)
        return picture

    return decorate


def sample_decoration(image: Image.Image, maps, cells, alpha: float = 0.6, style: str = "heatmap") -> Decorate:
    """Each word's soft map (the picture given) beside the cell sampled from it, outlined over the
    map shown faintly; a multi-head model's cells (one per head) all outlined."""
    maps = np.asarray(maps, dtype=np.float64)
    labels = ["soft map alpha_t", "sampled cell s_t ~ alpha_t"]

    def decorate(t: int | None, picture: Image.Image) -> Image.Image:
        plain = image.convert("RGB").resize(picture.size, Image.Resampling.BICUBIC)
        if t is None:
            return labelled_stack([plain, plain], labels, horizontal=True)
        chosen = np.asarray(cells[t]).reshape(-1, 2)
        sampled = overlay(plain, maps[t], alpha=alpha, style=style, hard_cell=tuple(chosen[0]))
        if len(chosen) > 1:  # hard multi-head: every head's cell
            draw = ImageDraw.Draw(sampled)
            for cell in chosen[1:]:
                x0, y0, x1, y1 = cell_box(tuple(cell), maps.shape[1:], picture.size)
                draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=(255, 255, 255), width=2)
        return labelled_stack([picture, sampled], labels, horizontal=True)

    return decorate
