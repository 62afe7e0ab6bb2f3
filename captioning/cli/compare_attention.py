"""``captioning compare-attention``: where do two (or more) checkpoints look? Side-by-side
attention for the same images.

    captioning compare-attention --checkpoints soft.ckpt hard.ckpt --labels soft hard \\
        --out compare/ assets/*.png [--gif]

For each image, ``DIR/<stem>.png`` holds one row per checkpoint: its label and caption as the
row's title, then a panel per word (the word over its attention overlay; hard-attention models
show the chosen cell outlined over a faint soft map). With ``--gif`` also ``DIR/<stem>.gif``: the
checkpoints' GIFs (``captioning attend``) side by side, frame t showing word t of each; a
caption that has ended keeps showing its last frame (the whole caption).

Multi-head models show the mean of their heads' maps; with ``--heads each`` they get one row (GIF
column) per head after the mean's. For the attention variants:

    captioning compare-attention --checkpoints soft.ckpt multihead.ckpt luong.ckpt local.ckpt \\
        --labels soft multihead luong local --num-beams 3 --out compare/ test_image.png
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, ImageDraw

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import (
    IMAGES_HELP,
    check_generation_flags,
    fraction,
    generation_args,
    generation_overrides,
    image_paths,
    refuse_urls,
    report_skipped,
)
from captioning.data.images import load_images
from captioning.errors import CaptioningError
from captioning.files import atomic_write_bytes
from captioning.viz import pictures as V

if TYPE_CHECKING:
    from captioning.api import Captioner

GAP = 8


def _words(captioner: Captioner, result: dict):
    """The words, their maps (T, gh, gw) and the hard cells (None for soft models), EOS dropped."""
    words, maps, cells = list(result["tokens"]), result["attention"], list(result["locations"])
    if words and words[-1] == captioner.vocab.EOS:
        words, maps, cells = words[:-1], maps[:-1], cells[:-1]
    return words, maps, (cells if captioner.attention_kind == "hard" else [None] * len(words))


def _fit(text: str, font, width: float) -> str:
    while len(text) > 1 and font.getlength(text) > width:
        text = text[:-2] + "\u2026"
    return text


def compare_grid(
    image: Image.Image,
    rows: Sequence[tuple[str, Captioner, dict]],
    panel_size: int = 128,
    alpha: float = 0.6,
    style: str = "heatmap",
) -> Image.Image:
    """One row per (label, captioner, result): a title line "label: caption", then a panel per word."""
    image = image.convert("RGB")
    scale = panel_size / max(image.size)
    shown = image.resize(
        (max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.BICUBIC
    )
    pw, ph = shown.size
    title_font, word_font = V.ui_font(16), V.ui_font(int(min(max(pw / 10, 11), 18)))
    title_h, word_h = V._line_height(title_font) + 4, V._line_height(word_font) + 2
    parts = [(label, captioner, *_words(captioner, result)) for label, captioner, result in rows]
    n_panels = max([len(p[2]) for p in parts] + [1])
    row_h = title_h + word_h + ph + 2 * GAP
    canvas = Image.new("RGB", (GAP + n_panels * (pw + GAP), GAP + len(parts) * row_h), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for r, (label, _captioner, words, maps, cells) in enumerate(parts):
        y = GAP + r * row_h
        title = f"{label}: {' '.join(words) if words else '(empty caption)'}"
        draw.text((GAP, y), _fit(title, title_font, canvas.width - 2 * GAP), font=title_font, fill=V.TEXT)
        y += title_h
        for t, word in enumerate(words):
            x = GAP + t * (pw + GAP)
            word = _fit(word, word_font, pw)
            draw.text((x + (pw - word_font.getlength(word)) / 2, y), word, font=word_font, fill=V.TEXT)
            canvas.paste(V.overlay(shown, maps[t], alpha=alpha, style=style, hard_cell=cells[t]), (x, y + word_h))
        if r:  # a rule between rows
            draw.line([(GAP, y - title_h - GAP), (canvas.width - GAP, y - title_h - GAP)], fill=(200, 200, 200))
    return canvas


def compare_frames(
    image: Image.Image, rows: Sequence[tuple[str, Captioner, dict]], alpha: float = 0.6, style: str = "heatmap"
) -> list[Image.Image]:
    """The checkpoints' GIF frames side by side under their labels; as many frames as the longest caption + 1."""
    title_font = V.ui_font(18)
    title_h = V._line_height(title_font) + 2 * GAP
    columns = []
    for label, captioner, result in rows:
        words, maps, cells = _words(captioner, result)
        hard = cells if captioner.attention_kind == "hard" else None
        columns.append((label, V.render_frames(image, words, maps, hard_cells=hard, alpha=alpha, style=style)))
    n = max(len(frames) for _, frames in columns)
    width = GAP + sum(frames[0].width + GAP for _, frames in columns)
    height = title_h + max(frames[0].height for _, frames in columns) + GAP
    out = []
    for t in range(n):
        canvas = Image.new("RGB", (width, height), (255, 255, 255))
        draw = ImageDraw.Draw(canvas)
        x = GAP
        for label, frames in columns:
            frame = frames[min(t, len(frames) - 1)]
            draw.text((x + (frame.width - title_font.getlength(label)) / 2, GAP), label, font=title_font, fill=V.TEXT)
            canvas.paste(frame, (x, title_h))
            x += frame.width + GAP
        out.append(canvas)
    return out


def with_heads(label: str, captioner: Captioner, result: dict) -> list[tuple[str, Captioner, dict]]:
    """The row of a checkpoint, then, for a multi-head model, one row per head."""
    rows = [(label, captioner, result)]
    if "head_attention" not in result:
        return rows
    maps = result["head_attention"]  # (T, heads, gh, gw)
    for k in range(maps.shape[1]):
        if "head_locations" in result:
            cells = [step[k] for step in result["head_locations"]]
        else:
            cells = [divmod(int(m.argmax()), m.shape[-1]) for m in maps[:, k]]
        rows.append((f"{label} head {k + 1}", captioner, dict(result, attention=maps[:, k], locations=cells)))
    return rows


def compare(
    checkpoints: Sequence[str],
    images: Sequence[str],
    out: str,
    labels: Sequence[str] | None = None,
    gif: bool = False,
    duration_ms: int = 800,
    panel_size: int = 128,
    alpha: float = 0.6,
    style: str = "heatmap",
    device: str | None = None,
    heads: str = "mean",
    **generate_kwargs,
) -> list[Path]:
    """Write the comparison PNG (and GIF) of every readable image; returns the files written."""
    from captioning.api import Captioner

    labels = list(labels) if labels else [Path(c).stem for c in checkpoints]
    if len(labels) != len(checkpoints):
        raise CaptioningError(f"{len(labels)} label(s) for {len(checkpoints)} checkpoint(s)")
    captioners = [Captioner.from_checkpoint(c, device) for c in checkpoints]
    good, bad = load_images(image_paths(images))
    report_skipped(bad)
    pils = [im for _, im in good]
    results = [c(pils, return_attention=True, **generate_kwargs) if pils else [] for c in captioners]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i, (path, image) in enumerate(good):
        rows = [(label, c, res[i]) for label, c, res in zip(labels, captioners, results)]
        if heads == "each":
            rows = [row for label, c, res in rows for row in with_heads(label, c, res)]
        buffer = io.BytesIO()
        compare_grid(image, rows, panel_size=panel_size, alpha=alpha, style=style).save(buffer, format="PNG")
        target = folder / f"{Path(path).stem}.png"
        atomic_write_bytes(target, buffer.getvalue())
        written.append(target)
        if gif:
            frames = [
                f.quantize(256, method=Image.Quantize.FASTOCTREE)
                for f in compare_frames(image, rows, alpha=alpha, style=style)
            ]
            buffer = io.BytesIO()
            frames[0].save(
                buffer, format="GIF", save_all=True, append_images=frames[1:], duration=int(duration_ms), loop=0
            )
            target = folder / f"{Path(path).stem}.gif"
            atomic_write_bytes(target, buffer.getvalue())
            written.append(target)
        print(f"{path}\t" + "\t".join(f"{label}: {res[i]['generated_text']}" for label, res in zip(labels, results)))
    return written


@COMMANDS.register("compare-attention")
class CompareAttention(Command):
    help = "side-by-side attention of two or more checkpoints on the same images (a row or GIF column each)"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("images", nargs="+", help=IMAGES_HELP)
        p.add_argument("--checkpoints", nargs="+", required=True, help="two or more checkpoints (e.g. soft and hard)")
        generation_args(p, checkpoint=False)
        p.add_argument("--labels", nargs="+", default=None, help="one name per checkpoint (default: file stems)")
        p.add_argument("--out", required=True, help="folder for <image stem>.png (and .gif)")
        p.add_argument("--gif", action="store_true", help="also write a side-by-side GIF per image")
        p.add_argument("--duration-ms", type=int, default=800, help="time per GIF frame")
        p.add_argument("--panel-size", type=int, default=128, help="long side of each word's panel, in pixels")
        p.add_argument("--alpha", type=fraction, default=0.6, help="heatmap opacity")
        p.add_argument("--style", choices=V.STYLES, default="heatmap")
        p.add_argument(
            "--heads",
            choices=("mean", "each"),
            default="mean",
            help="multi-head models: the mean of the heads' maps, or also a row per head",
        )

    def run(self, args: argparse.Namespace) -> int:
        refuse_urls(args.images)
        check_generation_flags(args)  # one-line errors in the flags' words, before any model loads
        written = compare(
            args.checkpoints,
            args.images,
            args.out,
            labels=args.labels,
            gif=args.gif,
            duration_ms=args.duration_ms,
            panel_size=args.panel_size,
            alpha=args.alpha,
            style=args.style,
            device=args.device,
            heads=args.heads,
            **generation_overrides(args),
        )
        return 0 if written else 1
