"""The atlas: the attention catalogue on one image and one word, a panel per model (``captioning atlas``).

:data:`CATALOGUE` is the one table of the mechanisms: each one's name, its training config on the
shapes data (configs/shapes_<name>.yaml) and its equation in the course notes' notation (s_{i-1} the
decoder's state before step i, h_j the annotation vector of location j, e_ij its score, alpha_ij its
weight, c_i the context). :func:`mechanism_of` names a model's mechanism from its decoder config;
:func:`choose_word` picks the word the panels show (the first object word every caption names);
:func:`atlas_panels` makes the panels from captioned results and :func:`render_atlas` draws them.
Each panel: the mechanism's name and equation, the caption, its object F1 when the image's objects
are known (:func:`image_objects`: the shapes data's annotations), and the word's map over the image.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from captioning.viz.fonts import shown_words
from captioning.viz.pictures import HIGHLIGHT, TEXT, _line_height, overlay, ui_font

Setting = object | Callable[[object], bool]  # a value the config's field must equal, or a test of it


@dataclass(frozen=True)
class Mechanism:
    """One mechanism of the catalogue: its name, its shapes config (under configs/), its equation and
    the decoder settings that make a model this mechanism (``kind`` "lstm" unless they say), and the
    mechanisms it stands for when both are found (scaled Luong is general's score times g)."""

    name: str
    config: str
    equation: str
    settings: Mapping[str, Setting] = field(default_factory=dict)
    replaces: tuple[str, ...] = ()

    def matches(self, decoder) -> bool:
        """Whether a decoder config (models/decoder.py's or another kind's) has every setting."""
        wanted = {"kind": "lstm", **self.settings}
        for name, value in wanted.items():
            have = getattr(decoder, name, None)
            if not (value(have) if callable(value) else have == value):
                return False
        return True


def _more_than_one(n) -> bool:
    return isinstance(n, int) and n > 1


def _some(n) -> bool:
    return isinstance(n, int) and n > 0


#: every mechanism of the course notes' catalogue, in the atlas's order
CATALOGUE: tuple[Mechanism, ...] = (
    Mechanism(
        "soft",
        "shapes_soft.yaml",
        "e_ij = v^T tanh(W s_{i-1} + U h_j);  alpha_ij = softmax_j(e_ij);  c_i = sum_j alpha_ij h_j",
    ),
    Mechanism(
        "hard",
        "shapes_hard.yaml",
        "alpha_ij = softmax_j(e_ij);  l_i ~ Multinoulli(alpha_i);  c_i = h_{l_i}",
        {"attention_kind": "hard"},
    ),
    Mechanism("dot", "shapes_dot.yaml", "e_ij = s_{i-1}^T h_j", {"score": "dot"}),
    Mechanism("general", "shapes_general.yaml", "e_ij = s_{i-1}^T W_a h_j", {"score": "general"}),
    Mechanism(
        "scaled_dot", "shapes_scaled_dot.yaml", "e_ij = (W_q s_{i-1})^T (W_k h_j) / sqrt(d)", {"score": "scaled_dot"}
    ),
    Mechanism("concat", "shapes_concat.yaml", "e_ij = v^T tanh(W [s_{i-1}; h_j])", {"score": "concat"}),
    Mechanism(
        "uniform",
        "shapes_uniform.yaml",
        "alpha_ij = 1 / L;  c_i = (1 / L) sum_j h_j  (no attention: one fixed context)",
        {"score": "uniform"},
    ),
    Mechanism(
        "normalized",
        "shapes_normalized.yaml",
        "e_ij = g (v / ||v||)^T tanh(W s_{i-1} + U h_j + b)",
        {"normalize": True},
    ),
    Mechanism(
        "scaled",
        "shapes_scaled.yaml",
        "e_ij = g s_{i-1}^T W_a h_j  (g a learned scalar)",
        {"scale": True},
        replaces=("dot", "general"),
    ),
    Mechanism(
        "sparsemax",
        "shapes_sparsemax.yaml",
        "alpha_i = sparsemax(e_i) = argmin_{p in simplex} ||p - e_i||^2",
        {"normalizer": "sparsemax"},
    ),
    Mechanism(
        "multihead",
        "shapes_multihead.yaml",
        "alpha^k_ij = softmax_j(e^k_ij);  c_i = W_o [c^1_i; ...; c^K_i]",
        {"heads": _more_than_one},
    ),
    Mechanism(
        "luong",
        "shapes_luong.yaml",
        "e_ij = score(s_i, h_j) after the step;  s~_i = tanh(W_c [c_i; s_i])",
        {"placement": "luong"},
    ),
    Mechanism(
        "local",
        "shapes_local.yaml",
        "p_i = (S - 1) sigmoid(v_p^T tanh(W_p s_{i-1}));  alpha_ij = softmax_j(e_ij - |j - p_i|^2 / 2 sigma^2)",
        {"window": "local"},
    ),
    Mechanism(
        "local_p",
        "shapes_local_p.yaml",
        "p_i = S sigmoid(v_p^T tanh(W_p s_i));  alpha_ij = softmax(e_i)_j exp(-|j - p_i|^2 / 2 sigma^2), "
        "|j - p_i| <= D, sigma = D / 2",
        {"window": "local_p"},
    ),
    Mechanism(
        "local_m",
        "shapes_local_m.yaml",
        "p_i = i (monotonic);  alpha_ij = softmax(e_i)_j exp(-|j - p_i|^2 / 2 sigma^2), |j - p_i| <= D",
        {"window": "local_m"},
    ),
    Mechanism(
        "hierarchical",
        "shapes_hierarchical.yaml",
        "alpha_ij = beta_{i, r(j)} gamma_ij:  the cells within each region r, then the regions",
        {"window": "hierarchical"},
    ),
    Mechanism(
        "attention_pool",
        "shapes_attention_pool.yaml",
        "u_j = tanh(W h_j + b);  alpha_j = softmax_j(u_j^T u_w);  s_0 = tanh(W_init sum_j alpha_j h_j)",
        {"init": "attention_pool"},
    ),
    Mechanism(
        "over_attention",
        "shapes_over_attention.yaml",
        "M = S^T H (words so far x locations);  alpha = softmax over locations, beta = softmax over words;  "
        "attention = alpha mean_i(beta)^T",
        {"over_attention": True},
    ),
    Mechanism(
        "aoa",
        "shapes_aoa.yaml",
        "i = W_i [c_i; s_{i-1}];  g = sigmoid(W_g [c_i; s_{i-1}]);  c_i <- g * i",
        {"aoa": True},
    ),
    Mechanism(
        "refiner",
        "shapes_refiner.yaml",
        "H <- H + MultiHead(LN H, LN H, LN H)  (the grid attends to itself), then e_ij = a(s_{i-1}, h_j)",
        {"refiner_layers": _some},
    ),
    Mechanism(
        "transformer",
        "shapes_transformer.yaml",
        "alpha = softmax(Q K^T / sqrt(d_k)):  the words attend to the words so far, then to the grid",
        {"kind": "transformer"},
    ),
    Mechanism(
        "conv",
        "shapes_conv.yaml",
        "d^l_i = W_d z^l_i + g_i;  alpha^l_ij = softmax_j(d^l_i . h_j);  c^l_i = sum_j alpha^l_ij (h_j + e_j)",
        {"kind": "conv"},
    ),
)
MECHANISMS = {m.name: m for m in CATALOGUE}


def mechanism_of(decoder) -> tuple[str, list[str]]:
    """(name, equations) of a decoder config: the catalogue's mechanisms it has, joined by " + " (a
    Luong model with a local window: "luong + local"); the paper's soft attention when none; "unknown"
    for a model without a decoder config (an ONNX folder's)."""
    if decoder is None:
        return "unknown", []
    found = [m for m in CATALOGUE if m.settings and m.matches(decoder)]
    replaced = {name for m in found for name in m.replaces}
    found = [m for m in found if m.name not in replaced]
    if not found:
        found = [MECHANISMS["soft"]]
    return " + ".join(m.name for m in found), [m.equation for m in found]


# ---------------------------------------------------------------------- the word and the objects
#: words never chosen as the atlas's word when no object word is shared (English function words)
STOP_WORDS = frozenset(
    "a an the of on in at to and or is are was were with there this that it its by for from as be "
    "has have one two three four some next left right above below".split()
)


def object_words(tokens: Sequence[str]) -> list[str]:
    """The words of a caption that name an object, in order: the shapes data's shape nouns (also of
    partial mentions, "a red circle"), else nothing."""
    from captioning.data.shapes import ALL_SHAPES, locate_objects

    found = {i for i, _ in locate_objects(tokens)}
    shapes = {str(s) for s in ALL_SHAPES}
    return [t for i, t in enumerate(tokens) if i in found or str(t).lower() in shapes]


def choose_word(captions: Sequence[Sequence[str]], word: str | None = None) -> tuple[str | None, str | None]:
    """(the word every panel shows, a note or None): ``word`` when given; else the first object word
    (:func:`object_words`) of the first caption that every caption names, else the first word of it
    that every caption has and is not a function word; None (each panel its own first object word)
    when no word is shared."""
    if word is not None:
        lacking = sum(word not in c for c in captions)
        return word, (f"{lacking} of {len(captions)} captions lack {word!r}" if lacking else None)
    if not captions:
        return None, None
    for candidates in (object_words(captions[0]), [t for t in captions[0] if str(t).lower() not in STOP_WORDS]):
        for w in candidates:
            if all(w in c for c in captions[1:]):
                return w, None
    return None, "no word is in every caption: each panel shows its own first object word"


def own_word(tokens: Sequence[str]) -> str | None:
    """A caption's own word when none is shared: its first object word, else its first content word."""
    for candidates in (object_words(tokens), [t for t in tokens if str(t).lower() not in STOP_WORDS], tokens):
        if candidates:
            return candidates[0]
    return None


def find_annotations(image: str | os.PathLike, levels: int = 4) -> Path | None:
    """The shapes data's annotation file (``dataset_shapes.json``, as make-shapes writes it) in a folder
    above ``image`` (at most ``levels`` up), or None."""
    folder = Path(image).resolve().parent
    for _ in range(levels):
        candidate = folder / "dataset_shapes.json"
        if candidate.is_file():
            return candidate
        if folder.parent == folder:
            break
        folder = folder.parent
    return None


def image_objects(image: str | os.PathLike, annotations: str | os.PathLike | None = None):
    """The (size, colour, shape) objects of ``image`` from shapes annotations (``annotations``, or the
    ``dataset_shapes.json`` found above the image): (objects, None), or (None, why not, in words)."""
    from captioning.data.formats import default_images_root, load_records
    from captioning.data.shapes import record_objects

    source = Path(annotations) if annotations is not None else find_annotations(image)
    if source is None:
        return None, None
    records = load_records(str(source))
    root = Path(default_images_root(str(source))).resolve()
    target = Path(image).resolve()
    same = [r for r in records if (root / r.path).resolve() == target]
    if not same:  # a copy of a dataset image: by file name when only one record has it
        same = [r for r in records if Path(r.path).name == target.name]
        if len(same) != 1:
            return None, f"{target.name} is not an image of {source}"
    if not same[0].objects:
        return None, f"{source} gives {target.name} no objects (shapes data has them)"
    return record_objects(same[0]), None


def caption_f1(tokens: Sequence[str], objects) -> float:
    """Object F1 of one caption against the image's objects (metrics/objects.py)."""
    from captioning.data.shapes import parse_objects
    from captioning.metrics.objects import object_f1

    return float(object_f1({0: parse_objects(list(tokens))}, {0: objects})["f1"])


# ---------------------------------------------------------------------- panels
@dataclass
class Panel:
    """One model's panel: its label, mechanism and equations, caption, chosen word and its map."""

    label: str
    mechanism: str
    equations: list[str]
    words: list[str]  # the caption's tokens, EOS dropped
    word: str | None  # the word shown (None: the caption lacks it)
    index: int | None  # its position in ``words``
    grid_map: np.ndarray | None  # (gh, gw) its attention map
    cell: tuple[int, int] | None = None  # a hard model's chosen cell
    f1: float | None = None

    def as_json(self) -> dict:
        return {
            "label": self.label,
            "mechanism": self.mechanism,
            "equations": self.equations,
            "caption": " ".join(self.words),
            "word": self.word,
            "index": self.index,
            "attention": None if self.grid_map is None else np.round(self.grid_map, 4).tolist(),
            "cell": None if self.cell is None else list(self.cell),
            "object_f1": self.f1,
        }


def atlas_panels(
    models: Sequence[tuple[str, object, dict, bool]], word: str | None = None, objects=None, eos: str = "<end>"
) -> tuple[list[Panel], str | None, str | None]:
    """The panels of captioned results: ``models`` (label, decoder config, the Captioner's result with
    "attention" and "locations", whether it is hard attention), the word each panel shows
    (:func:`choose_word` from ``word``), ``objects`` for object F1. Returns (panels, the shared word or
    None, a note or None)."""
    captions = [[t for t in result["tokens"] if t != eos] for _, _, result, _ in models]
    chosen, note = choose_word(captions, word)
    panels = []
    for (label, decoder, result, hard), tokens in zip(models, captions):
        name, equations = mechanism_of(decoder)
        shown = chosen if chosen is not None or word is not None else own_word(tokens)
        index = tokens.index(shown) if shown in tokens else None
        panels.append(
            Panel(
                label=label,
                mechanism=name,
                equations=equations,
                words=tokens,
                word=shown if index is not None else None,
                index=index,
                grid_map=None if index is None else np.asarray(result["attention"][index], dtype=np.float64),
                cell=tuple(int(v) for v in result["locations"][index]) if hard and index is not None else None,
                f1=None if objects is None else caption_f1(tokens, objects),
            )
        )
    return panels, chosen, note


def _wrap_text(text: str, font, width: int) -> list[str]:
    """``text`` broken into lines of at most ``width`` pixels at its spaces (a longer word alone)."""
    lines, line = [], ""
    for part in text.split(" "):
        trial = f"{line} {part}" if line else part
        if line and font.getlength(trial) > width:
            lines.append(line)
            line = part
        else:
            line = trial
    return lines + [line] if line else lines


def _caption_lines(words: Sequence[str], font, width: int) -> list[list[tuple[int, str]]]:
    """The caption's words (index, text) broken into lines of ``width`` pixels."""
    texts, after = shown_words(list(words))
    lines, line, used = [], [], 0.0
    for i, text in enumerate(texts):
        w = font.getlength(text + after[i])
        if line and used + w > width:
            lines.append(line)
            line, used = [], 0.0
        line.append((i, text + after[i]))
        used += w
    return lines + [line] if line else lines


def _fonts(panel: Panel):
    """(title, small, caption) fonts of a panel: a CJK font where its words need one."""
    return ui_font(17, panel.label), ui_font(12, panel.words), ui_font(14, panel.words)


def _header(panel: Panel, width: int) -> tuple[list[str], list[str]]:
    """A panel's title lines (the mechanism, and the model's label) and equation lines, ``width`` wide."""
    title_font, small, _ = _fonts(panel)
    title = panel.mechanism + (f"  ({panel.label})" if panel.label and panel.label != panel.mechanism else "")
    return _wrap_text(title, title_font, width), [
        line for eq in panel.equations for line in _wrap_text(eq, small, width)
    ]


def header_height(panel: Panel, width: int) -> int:
    """The height of a panel's title and equations (:func:`render_panel` draws the image under it)."""
    title_font, small, _ = _fonts(panel)
    titles, equations = _header(panel, width)
    return _line_height(title_font) * len(titles) + _line_height(small) * len(equations) + 6


def render_panel(
    image: Image.Image, panel: Panel, size: int = 240, alpha: float = 0.6, header: int | None = None
) -> Image.Image:
    """One panel: the mechanism's name (and the model's label) and its equations (in ``header`` pixels
    at least: the images of a row line up), the word's map over the image, the caption with the word
    marked, the word and its object F1."""
    scale = size / max(image.size)
    shown = image.convert("RGB").resize(
        (max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.BICUBIC
    )
    picture = shown if panel.grid_map is None else overlay(shown, panel.grid_map, alpha=alpha, hard_cell=panel.cell)
    title_font, small, caption_font = _fonts(panel)
    pad, width = 8, size
    title_lines, equation_lines = _header(panel, width)
    caption_lines = _caption_lines(panel.words or ["(empty caption)"], caption_font, width)
    notes = [f"the word: {panel.word!r}" if panel.word is not None else "the word: not in this caption (no map)"]
    if panel.f1 is not None:
        notes.append(f"object F1 {panel.f1:.2f}")
    text_h = max(header or 0, header_height(panel, width))
    bottom = _line_height(caption_font) * len(caption_lines) + _line_height(small) * len(notes) + 10
    canvas = Image.new("RGB", (width + 2 * pad, pad + text_h + picture.height + bottom + pad), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    y = pad
    for line in title_lines:
        draw.text((pad, y), line, font=title_font, fill=TEXT)
        y += _line_height(title_font)
    for line in equation_lines:
        draw.text((pad, y), line, font=small, fill=(70, 70, 90))
        y += _line_height(small)
    y = pad + text_h
    canvas.paste(picture, (pad + (width - picture.width) // 2, y))
    y += picture.height + 4
    for line in caption_lines:
        x = float(pad)
        for i, text in line:
            draw.text((x, y), text, font=caption_font, fill=HIGHLIGHT if i == panel.index else TEXT)
            x += caption_font.getlength(text)
        y += _line_height(caption_font)
    for note in notes:
        draw.text((pad, y + 2), note, font=small, fill=TEXT)
        y += _line_height(small)
    return canvas


def render_atlas(
    image: Image.Image,
    panels: Sequence[Panel],
    word: str | None = None,
    note: str | None = None,
    cols: int | None = None,
    size: int = 240,
    alpha: float = 0.6,
) -> Image.Image:
    """The atlas: a title naming the word, then the panels (:func:`render_panel`) row by row, ``cols``
    a row (default: up to 4), each cell as tall as the tallest panel."""
    if not panels:
        raise ValueError("an atlas of no panels")
    header = max(header_height(p, size) for p in panels)  # every image at the same height
    pictures = [render_panel(image, p, size, alpha, header) for p in panels]
    cols = max(1, min(cols or 4, len(pictures)))
    rows = -(-len(pictures) // cols)
    pw, ph = max(p.width for p in pictures), max(p.height for p in pictures)
    mechanisms = "one attention mechanism looks" if len(panels) == 1 else f"{len(panels)} attention mechanisms look"
    heading = f"Where {mechanisms} for {word!r}" if word is not None else f"Where {mechanisms}"
    gap = 6
    width = cols * (pw + gap) + gap
    font, small = ui_font(20, [heading]), ui_font(14, [note or ""])
    lines = [(line, font) for line in _wrap_text(heading, font, width - 24)]  # a narrow atlas wraps its title
    lines += [(line, small) for line in (_wrap_text(note, small, width - 24) if note else [])]
    heights = [_line_height(f) for _, f in lines]
    top = 10 + sum(heights) + 6
    canvas = Image.new("RGB", (width, top + rows * (ph + gap) + gap), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for k, (line, f) in enumerate(lines):
        draw.text((12, 8 + sum(heights[:k])), line, font=f, fill=TEXT)
    for n, picture in enumerate(pictures):
        r, c = divmod(n, cols)
        x, y = gap + c * (pw + gap), top + r * (ph + gap)
        draw.rectangle([x - 1, y - 1, x + pw, y + ph], outline=(225, 225, 230))
        canvas.paste(picture, (x, y))
    return canvas
