"""The synthetic shapes dataset: coloured shapes on a noisy background, with captions and boxes.

Each image holds 1 to 4 non-overlapping objects, each a (size, colour, shape) triple, drawn with
PIL on a low-contrast random colour gradient plus pixel noise. Five reference captions name every
object's size, colour and shape and say where the objects are. The most common phrasing (always
the first reference) lists the objects in a canonical order, left to right, so that a small
CNN + LSTM with attention can learn it on a CPU in minutes.

The annotations are one Karpathy split file (``dataset_shapes.json``) that ``load_karpathy`` reads,
extended per image with ``width``, ``height`` and ``objects`` (size, color, shape, bbox, words);
``bbox`` is ``[x0, y0, x1, y1]`` in pixels with exclusive ends, so ``x1 - x0`` is the width.
Generation is deterministic: the same arguments give the same image bytes and the same JSON.

``preset="hard"`` (:data:`PRESETS`) is a harder setting for comparing models: 2 to 4 objects of
three sizes, eight colours and six shapes on a textured background (stripes, blobs and stronger
noise), saved as JPEG (quality 70). The default (``preset="demo"``) is the demo's data, unchanged.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from captioning.data.shapes.chinese import captions_zh, locate_objects_zh
from captioning.data.shapes.holdout import NOVEL_SPLIT, holds_novel, parse_holdout
from captioning.data.shapes.layout import centre, grid_cell, pair_order
from captioning.errors import ConfigError
from captioning.tokenizers import cjk_share

SIZES = ("small", "large")  # the demo's words; the hard preset adds HARD_* to them
COLOURS = ("red", "green", "blue", "yellow", "purple")
SHAPES = ("circle", "square", "triangle", "cross")
HARD_SIZES = ("small", "medium", "large")
HARD_COLOURS = COLOURS + ("orange", "cyan", "white")
HARD_SHAPES = SHAPES + ("diamond", "ring")
#: every word a caption of either setting can use (what parse_objects recognises)
ALL_SIZES, ALL_COLOURS, ALL_SHAPES = frozenset(HARD_SIZES), frozenset(HARD_COLOURS), frozenset(HARD_SHAPES)

_RGB = {  # saturated, far apart from each other and from the dull background
    "red": (225, 35, 35),
    "green": (40, 190, 50),
    "blue": (45, 90, 240),
    "yellow": (240, 225, 40),
    "purple": (175, 60, 215),
    "orange": (245, 140, 30),
    "cyan": (40, 210, 220),
    "white": (235, 235, 235),
}
_SIDE = {"small": (0.16, 0.20), "large": (0.30, 0.34)}  # object side, as a fraction of the image
_HARD_SIDE = {"small": (0.13, 0.16), "medium": (0.20, 0.23), "large": (0.27, 0.31)}
_MARGIN = 2  # pixels kept free between two boxes and between a box and the border
_NOISE_STD = 12.0  # pixel noise (0-255 scale), added over objects and background alike
_SPLITS = ("train", "val", "test")
_NUMBERS = {3: "three", 4: "four"}

Triple = tuple[str, str, str]


@dataclass(frozen=True)
class ShapesStyle:
    """What the images hold and how they are drawn and saved (the demo's by default)."""

    min_objects: int = 1
    max_objects: int = 4
    sizes: tuple = SIZES
    colours: tuple = COLOURS
    shapes: tuple = SHAPES
    sides: tuple = tuple(_SIDE.items())  # (size word, (min, max) side as a fraction of the image)
    texture: bool = False  # textured background (stripes and blobs) instead of the plain gradient
    noise_std: float = _NOISE_STD
    colour_jitter: int = 20  # each object's colour is its palette entry +- this, per channel
    image_format: str = "png"  # "png" or "jpeg"
    jpeg_quality: int = 70


#: the named settings of ``captioning make-shapes --preset``
PRESETS = {
    "demo": ShapesStyle(),
    "hard": ShapesStyle(
        min_objects=2,
        max_objects=4,
        sizes=HARD_SIZES,
        colours=HARD_COLOURS,
        shapes=HARD_SHAPES,
        sides=tuple(_HARD_SIDE.items()),
        texture=True,
        noise_std=18.0,
        colour_jitter=30,
        image_format="jpeg",
    ),
}


# --------------------------------------------------------------------------- drawing
def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A low-contrast linear gradient between two dull random colours: (S, S, 3) float."""
    c0, c1 = rng.uniform(35, 115, size=(2, 3))
    angle = rng.uniform(0, 2 * np.pi)
    ys, xs = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    t = np.cos(angle) * xs + np.sin(angle) * ys  # (S, S)
    t = (t - t.min()) / (t.max() - t.min() + 1e-9)
    return c0 + t[..., None] * (c1 - c0)


def _texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """A textured background: the gradient plus random stripes and soft blobs: (S, S, 3) float."""
    base = _background(rng, size)
    ys, xs = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    for _ in range(int(rng.integers(1, 4))):  # stripes of random period, angle and colour
        angle, period, phase = rng.uniform(0, np.pi), rng.uniform(0.08, 0.3), rng.uniform(0, 2 * np.pi)
        wave = np.sin(2 * np.pi * (np.cos(angle) * xs + np.sin(angle) * ys) / period + phase)
        base = base + wave[..., None] * rng.uniform(-22, 22, size=3)
    for _ in range(int(rng.integers(2, 6))):  # blobs: gaussian spots of a random colour
        cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.2)
        spot = np.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * r * r))
        base = base + spot[..., None] * rng.uniform(-40, 40, size=3)
    return base


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: Sequence[int], fill) -> None:
    """Draw one shape filling the square box [x0, y0, x1, y1) (exclusive ends)."""
    x0, y0, x1, y1 = box
    xe, ye = x1 - 1, y1 - 1  # PIL's coordinates are inclusive
    if shape == "circle":
        draw.ellipse([x0, y0, xe, ye], fill=fill)
    elif shape == "square":
        draw.rectangle([x0, y0, xe, ye], fill=fill)
    elif shape == "triangle":
        draw.polygon([(x0, ye), (xe, ye), ((x0 + xe) / 2, y0)], fill=fill)
    elif shape == "cross":  # a plus sign with arms a third of the side thick
        a, b = x0 + (x1 - x0) // 3, x0 + 2 * (x1 - x0) // 3
        c, d = y0 + (y1 - y0) // 3, y0 + 2 * (y1 - y0) // 3
        draw.rectangle([a, y0, b - 1, ye], fill=fill)
        draw.rectangle([x0, c, xe, d - 1], fill=fill)
    elif shape == "diamond":
        mx, my = (x0 + xe) / 2, (y0 + ye) / 2
        draw.polygon([(mx, y0), (xe, my), (mx, ye), (x0, my)], fill=fill)
    elif shape == "ring":  # a circle with a hole, the ring a quarter of the side thick
        draw.ellipse([x0, y0, xe, ye], outline=fill, width=max(2, (x1 - x0) // 4))
    else:
        raise ValueError(f"unknown shape {shape!r}")


def _place(rng: np.random.Generator, sides: list[int], size: int) -> list[list[int]] | None:
    """Random boxes of the given sides, inside the image and `_MARGIN` apart; None if stuck."""
    boxes: list[list[int]] = []
    for s in sides:
        for _ in range(100):
            x0, y0 = (int(v) for v in rng.integers(_MARGIN, size - _MARGIN - s + 1, size=2))
            box = [x0, y0, x0 + s, y0 + s]
            if all(
                box[0] >= b[2] + _MARGIN
                or b[0] >= box[2] + _MARGIN
                or box[1] >= b[3] + _MARGIN
                or b[1] >= box[3] + _MARGIN
                for b in boxes
            ):
                boxes.append(box)
                break
        else:
            return None
    return boxes


def _make_image(
    rng: np.random.Generator, size: int, style: ShapesStyle = PRESETS["demo"]
) -> tuple[Image.Image, list[dict]]:
    """One image and its objects (dicts with size, color, shape, bbox, words).

    The demo's style draws its random numbers exactly as it always did (same images for a seed)."""
    side_range = dict(style.sides)
    while True:
        n = int(rng.integers(style.min_objects, style.max_objects + 1))
        words = [
            (
                style.sizes[rng.integers(len(style.sizes))],
                style.colours[rng.integers(len(style.colours))],
                style.shapes[rng.integers(len(style.shapes))],
            )
            for _ in range(n)
        ]
        sides = [int(round(size * rng.uniform(*side_range[w[0]]))) for w in words]
        boxes = _place(rng, sides, size)
        if boxes is not None:
            break
    background = _texture(rng, size) if style.texture else _background(rng, size)
    img = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    objects = []
    jitter = style.colour_jitter
    for (sz, colour, shape), box in zip(words, boxes):
        fill = tuple(int(c) for c in np.clip(np.array(_RGB[colour]) + rng.integers(-jitter, jitter + 1, 3), 0, 255))
        _draw_shape(draw, shape, box, fill)
        objects.append({"size": sz, "color": colour, "shape": shape, "bbox": box, "words": [sz, colour, shape]})
    pixels = np.asarray(img, dtype=np.float64) + rng.normal(0.0, style.noise_std, (size, size, 3))
    return Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8)), objects


# --------------------------------------------------------------------------- captions
def _name(obj: dict) -> str:
    return " ".join(obj["words"])


def _position(obj: dict, size: int) -> str:
    """Where an object lies on a 3 x 3 grid, as a phrase: 'in the top left', 'on the right'."""
    r, c = grid_cell(obj, size)
    col, row = ("left", "", "right")[c], ("top", "", "bottom")[r]
    if row and col:
        return f"in the {row} {col}"
    if row:
        return f"at the {row}"
    return f"on the {col}" if col else "in the centre"


def _listing(names: list[str]) -> str:
    """'a A' | 'a A and a B' | 'a A , a B and a C'."""
    names = [f"a {n}" for n in names]
    return names[0] if len(names) == 1 else " , ".join(names[:-1]) + " and " + names[-1]


def _captions(rng: np.random.Generator, objects: list[dict], size: int) -> list[str]:
    """Five reference captions: the canonical phrasing first, then four others drawn at random."""
    ltr = sorted(objects, key=lambda o: centre(o))  # canonical order: left to right, then top down
    names = [_name(o) for o in ltr]
    if len(objects) == 1:
        o, pos = names[0], _position(objects[0], size)
        canonical = f"a {o}"
        others = [
            f"a {o} {pos}",
            f"there is a {o}",
            f"there is a {o} {pos}",
            f"a picture of a {o}",
            f"a single {o} {pos}",
        ]
    elif len(objects) == 2:
        first, second, vertical = pair_order(ltr)
        if vertical:  # one above the other: named top to bottom, said above / below
            rel, inv, axis = "above", "below", "from top to bottom"
        else:
            rel, inv, axis = "to the left of", "to the right of", "from left to right"
        a, b = _name(first), _name(second)
        canonical = f"a {a} {rel} a {b}"
        others = [
            f"a {b} {inv} a {a}",
            f"there is a {a} {rel} a {b}",
            f"a {a} and a {b} {axis}",
            f"a {a} {_position(first, size)} and a {b} {_position(second, size)}",
            f"two shapes a {a} {rel} a {b}",
        ]
    else:
        ttb = sorted(objects, key=lambda o: centre(o)[::-1])
        canonical = f"{_listing(names)} from left to right"
        others = [
            f"{_listing(names[::-1])} from right to left",
            f"{_listing([_name(o) for o in ttb])} from top to bottom",
            f"a {names[0]} next to {_listing(names[1:])}",
            f"{_NUMBERS[len(objects)]} shapes {_listing(names)} from left to right",
        ]
        if len(objects) == 3:  # with four objects this phrasing runs past 30 tokens
            others.append(
                " , ".join(f"a {_name(o)} {_position(o, size)}" for o in ltr[:-1])
                + f" and a {names[-1]} {_position(ltr[-1], size)}"
            )
    picked = rng.choice(len(others), size=4, replace=False)
    return [canonical] + [others[i] for i in sorted(picked)]


#: the captions' languages of ``captioning make-shapes --language``
LANGUAGES = {"en": _captions, "zh": captions_zh}


# --------------------------------------------------------------------------- dataset
def generate(
    out_dir: str | Path,
    n_train: int = 4000,
    n_val: int = 200,
    n_test: int = 300,
    seed: int = 0,
    image_size: int = 64,
    progress: bool = True,
    preset: str | ShapesStyle = "demo",
    holdout: str | Sequence = (),
    n_test_novel: int | None = None,
    language: str = "en",
) -> Path:
    """Write the shapes dataset under `out_dir`; return the annotation file's path.

    Images go to ``out_dir/images/{split}/{imgid:06d}.png`` (``.jpg`` for a JPEG style),
    annotations to ``out_dir/dataset_shapes.json`` (Karpathy format plus width, height and
    objects). ``preset``: a name of :data:`PRESETS` ("demo", "hard") or a :class:`ShapesStyle`.
    ``holdout``: colour-shape pairs ("red:circle,blue:square") kept out of the train, val and test
    images; ``n_test_novel`` images (default ``n_test``) holding at least one of them form the
    ``test_novel`` split (data/shapes/holdout.py). Without a holdout the images are the same as before.
    ``language``: "en" or "zh" (data/shapes/chinese.py: the same images, Chinese captions).
    """
    if language not in LANGUAGES:
        raise ConfigError(f"--language: expected one of {', '.join(LANGUAGES)}, got {language!r}")
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ConfigError(f"shapes dataset: unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
        style = PRESETS[preset]
    else:
        style = preset
    if not 1 <= style.min_objects <= style.max_objects:
        raise ConfigError(
            f"shapes dataset: expected 1 <= min_objects <= max_objects, got {style.min_objects}, {style.max_objects}"
        )
    if style.image_format not in ("png", "jpeg"):
        raise ConfigError(f"shapes dataset: image_format must be 'png' or 'jpeg', got {style.image_format!r}")
    counts = {"train": n_train, "val": n_val, "test": n_test}
    pairs = parse_holdout(holdout, style.colours, style.shapes) if holdout else ()
    if pairs:
        counts[NOVEL_SPLIT] = n_test if n_test_novel is None else n_test_novel
        for split, n in counts.items():
            if n == 0:
                raise ConfigError(f"--holdout: the {split} split would be empty (give it at least one image)")
    for split, n in counts.items():
        if int(n) != n or n < 0:
            raise ConfigError(f"shapes dataset: n_{split} must be a non-negative integer, got {n!r}")
    if image_size < 32:
        raise ConfigError(f"shapes dataset: image_size must be at least 32 pixels, got {image_size}")
    out_dir = Path(out_dir)
    total = sum(counts.values())
    # one independent seed per image: an image does not depend on how many others are made
    image_seeds = np.random.default_rng(seed).integers(0, 2**63 - 1, size=total)
    splits = [s for s in counts for _ in range(counts[s])]
    for split in counts:
        (out_dir / "images" / split).mkdir(parents=True, exist_ok=True)

    images = []
    for imgid in tqdm(range(total), desc="shapes", unit="img", disable=None if progress else True):
        rng = np.random.default_rng(image_seeds[imgid])
        split = splits[imgid]
        img, objects = _make_image(rng, image_size, style)
        # with a holdout, redraw (from the image's own stream) until the image is on its split's side
        while pairs and holds_novel(objects, pairs) != (split == NOVEL_SPLIT):
            img, objects = _make_image(rng, image_size, style)
        if style.image_format == "jpeg":
            filename = f"{imgid:06d}.jpg"
            img.save(out_dir / "images" / split / filename, format="JPEG", quality=style.jpeg_quality)
        else:
            filename = f"{imgid:06d}.png"
            img.save(out_dir / "images" / split / filename, format="PNG")
        raws = LANGUAGES[language](rng, objects, image_size)
        sentids = [5 * imgid + k for k in range(len(raws))]
        images.append(
            {
                "filepath": f"images/{split}",
                "filename": filename,
                "imgid": imgid,
                "split": split,
                "sentences": [
                    {"tokens": raw.split(), "raw": raw, "imgid": imgid, "sentid": sid}
                    if language == "en"
                    else {"raw": raw, "imgid": imgid, "sentid": sid}  # split by the data's tokenizer
                    for raw, sid in zip(raws, sentids)
                ],
                "sentids": sentids,
                "width": image_size,
                "height": image_size,
                "objects": objects,
            }
        )

    path = out_dir / "dataset_shapes.json"
    tmp = path.with_name(path.name + ".tmp")
    data = {"dataset": "shapes", "images": images}
    if pairs:
        data["holdout"] = [f"{c}:{s}" for c, s in pairs]
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- parsing
def parse_objects(caption: str | Sequence[str]) -> list[Triple]:
    """The (size, colour, shape) mentions in a caption, in order.

    A mention is a size word directly followed by a colour word and a shape word; partial
    mentions ("a red circle") are not counted. Accepts a string or a list of tokens.
    """
    if isinstance(caption, str) and cjk_share([caption]) > 0.5:
        return [triple for _, triple in locate_objects_zh(caption)]
    tokens = re.findall(r"[a-z]+", caption.lower()) if isinstance(caption, str) else caption
    return [triple for _, triple in locate_objects(tokens)]


def locate_objects(tokens: Sequence[str]) -> list[tuple[int, Triple]]:
    """(index of the shape word, (size, colour, shape)) of each mention in ``tokens``, in order.

    The scan behind :func:`parse_objects`: a size word directly followed by a colour word and a
    shape word (case-insensitive); partial mentions do not count.
    """
    tokens = [str(t).lower() for t in tokens]
    if cjk_share(tokens) > 0.5:  # Chinese captions (data/shapes/chinese.py), in any tokenizer's tokens
        return locate_objects_zh(tokens)
    found, i = [], 0
    while i + 2 < len(tokens):
        triple = tuple(tokens[i : i + 3])
        if triple[0] in ALL_SIZES and triple[1] in ALL_COLOURS and triple[2] in ALL_SHAPES:
            found.append((i + 2, triple))
            i += 3
        else:
            i += 1
    return found


def record_objects(record) -> list[Triple]:
    """Ground-truth (size, colour, shape) triples of an ImageRecord, or of a dict with 'objects'."""
    objects = record["objects"] if isinstance(record, dict) else record.objects
    return [tuple(o["words"]) if "words" in o else (o["size"], o["color"], o["shape"]) for o in objects or []]


# --------------------------------------------------------------------------- the dataset's scores
def shapes_scores(
    records: Sequence, predictions: dict, alignments: dict | None = None, images_root: str | None = None
) -> dict:
    """What the evaluator adds for the shapes data: object F1 and, given alignments, grounding.

    ``records``: the scored images (ImageRecords with objects); ``predictions``: image_id ->
    caption; ``alignments``: image_id -> (words, alphas (T, L), locations (T,)).
    Returns {"object_f1", "object_precision", "object_recall"} and, with alignments, "grounding".
    """
    from captioning.metrics.objects import object_f1

    truth = {r.image_id: record_objects(r) for r in records if r.objects}
    f1 = object_f1({i: parse_objects(predictions[i]) for i in truth}, truth)
    scores = {"object_f1": f1["f1"], "object_precision": f1["precision"], "object_recall": f1["recall"]}
    if alignments is not None:
        scores["grounding"] = grounding({r.image_id: r for r in records}, alignments, images_root)
    return scores


def _image_size(rec, images_root: str | None) -> tuple[int, int] | None:
    """(W, H) of the original image: from the record, else read from the file's header."""
    if rec.width and rec.height:
        return int(rec.width), int(rec.height)
    if images_root is None:
        return None
    try:
        with Image.open(os.path.join(images_root, rec.path)) as im:
            return im.size
    except OSError:
        return None


def grounding(records: dict, alignments: dict, images_root: str | None = None) -> dict:
    """Attention grounding over every generated word that names an object of the image.

    ``records``: image_id -> ImageRecord; ``alignments``: image_id -> (words, alphas (T, L),
    locations (T,) or None) with word t generated while attending with alphas[t] (EOS steps past the words
    are ignored). A word names an object when it is the shape noun of a full (size, colour, shape)
    mention that matches one of the image's objects; a mention of a triple the image holds twice
    takes the first object of that triple not yet named in the caption, and mentions beyond the
    image's count name nothing. Each such word is scored with the object's bbox
    (:func:`captioning.metrics.grounding_scores`).

    Returns grounding_scores' dict; for hard attention (``locations`` given) also "chosen_cell":
    the same scores of a one-hot map at the cell each word actually attended.
    """
    from captioning.common import grid_shape
    from captioning.metrics.grounding import grounding_scores

    soft, chosen = [], []
    for image_id, (words, alphas, locations) in alignments.items():
        rec = records[image_id]
        size = _image_size(rec, images_root) if rec.objects else None
        if size is None:
            continue
        alphas = np.asarray(alphas, dtype=np.float64)
        gh, gw = grid_shape(alphas.shape[-1])  # (T, L) -> maps of (gh, gw)
        unused: dict = {}  # triple -> the image's objects of that triple not yet named, in order
        for obj in rec.objects:
            triple = tuple(str(w).lower() for w in obj.get("words") or (obj["size"], obj["color"], obj["shape"]))
            unused.setdefault(triple, []).append(obj)
        for t, triple in locate_objects(words):  # (index of the shape noun, triple)
            if t >= len(alphas) or not unused.get(triple):
                continue
            bbox = unused[triple].pop(0).get("bbox")
            if bbox is None:  # an object without a box (data/formats/base.py: check_objects) is not scored
                continue
            soft.append((alphas[t].reshape(gh, gw), size, bbox))
            if locations is not None:
                one_hot = np.zeros(gh * gw)
                one_hot[int(locations[t])] = 1.0
                chosen.append((one_hot.reshape(gh, gw), size, bbox))
    scores = grounding_scores(soft)
    if any(a[2] is not None for a in alignments.values()):
        scores["chosen_cell"] = grounding_scores(chosen)
    return scores
