"""``captioning attend``: where the model looked for each word, as a GIF (a frame per word) and/or a
grid PNG (a panel per word) per image; ``--view`` draws another view of the attention instead
(captioning/viz/views.py: the alignment matrix, self-attention, the gate, the window, the sampled cell).

The images stream as ``caption``'s do (data/inputs.py): their names are listed first (they decide
the pictures' file names), then the images are read a batch at a time, captioned, drawn and dropped."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from captioning.cli.caption import load_captioner, report_problems
from captioning.cli.commands import COMMANDS, Command
from captioning.cli.focus import focus_args, focus_misfits, focus_overrides
from captioning.cli.options import (
    STREAM_HELP,
    at_least,
    choose_layer,
    fraction,
    generation_args,
    generation_overrides,
    layer_arg,
    loader_args,
    refuse_urls,
)
from captioning.errors import CaptioningError
from captioning.files import printable

#: the file formats attend writes, by --out suffix
FILE_SUFFIXES = (".gif", ".png")


def out_kind(out: Path) -> str:
    """What ``--out`` names: "file" (a .gif or .png), "folder" (an existing folder, or a name without
    a suffix), else a one-line error (``x.txt`` would otherwise become a folder named x.txt)."""
    if out.is_dir():
        return "folder"
    if out.suffix.lower() in FILE_SUFFIXES:
        return "file"
    if out.suffix:
        raise CaptioningError(
            f"--out {out}: attend writes {' or '.join(FILE_SUFFIXES)} files, not {out.suffix}; "
            "for a folder give a name without a suffix (or an existing folder)"
        )
    return "folder"


def attend_targets(paths: Sequence[str], out: Path, fmt: str | None) -> list[list[tuple[Path, str]]]:
    """The files to write for each image: [(path, format), ...] per image.

    ``out`` ending in .gif / .png is one file for one image (``fmt`` must agree); otherwise a folder
    (:func:`out_kind`), where each image gets <stem>.<format>, or <stem>.<source extension>.<format>
    when two sources share a stem (photo.jpg and photo.png), numbered if still not unique: nothing is
    overwritten by its sibling.
    """
    suffix = out.suffix.lower()
    if out_kind(out) == "file":
        if len(paths) != 1:
            raise CaptioningError(f"--out {out}: one file for {len(paths)} images; give a folder")
        if fmt == "both":
            raise CaptioningError(f"--format both writes a GIF and a PNG: give a folder, not --out {out}")
        if fmt is not None and fmt != suffix[1:]:
            raise CaptioningError(f"--out {out} names a {suffix} file but --format is {fmt}: make them agree")
        return [[(out, suffix[1:])]]
    formats = ("gif", "png") if fmt == "both" else (fmt or "gif",)
    stems = Counter(Path(p).stem for p in paths)
    taken: set = set()
    targets = []
    for p in paths:
        base = Path(p).stem if stems[Path(p).stem] == 1 else Path(p).name
        name, k = base, 1
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        targets.append([(out / f"{name}.{f}", f) for f in formats])
    return targets


def listed_sources(args) -> tuple[list, list]:
    """The images of the arguments (data/inputs.py: files, folders, globs, @lists, shards), listed by
    name and place only (their names decide the pictures' file names), and (argument, reason) for
    the arguments that name none; none at all is a one-line error."""
    from captioning.data.inputs import Problems, check_items, iter_sources

    items = check_items(args.images)
    problems = Problems()
    sources = list(iter_sources(items, problems))
    if not sources:
        raise CaptioningError(
            problems[0][1] if len(problems) == 1 else f"no images found in {', '.join(i for i, _ in problems)}"
        )
    return sources, problems


def writable_folder(folder: Path) -> None:
    """Create ``folder`` if needed; a one-line error if it cannot be made or written to."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise CaptioningError(f"{folder}: cannot write there ({err.strerror or err})") from None


def check_view(captioner, args) -> None:
    """One line, before anything is written, for a ``--view`` the model does not have (naming those
    it has) or flags it does not go with."""
    from captioning.errors import ConfigError
    from captioning.viz.views import MATRIX_VIEWS

    view = args.view
    if view == "maps":
        return
    if not hasattr(captioner, "views"):
        raise ConfigError(
            f"--view {view}: an ONNX folder's model gives its maps only (--view maps); give its checkpoint"
        )
    captioner.check_view(view, "--view")
    if view in MATRIX_VIEWS:
        if args.format in ("gif", "both") or Path(args.out).suffix.lower() == ".gif":
            raise ConfigError(
                f"--view {view}: a matrix, drawn as a PNG; give --format png or an --out of .png or a folder"
            )
    if view == "sample" and args.attention_mode not in (None, "sample"):
        raise ConfigError(
            f"--view sample: draws the cells sampled with --attention-mode sample, not {args.attention_mode}"
        )
    for flag, value, plain in (
        ("--head", args.head, None),
        ("--heads", args.heads, "mean"),
        ("--members", args.members, "mean"),
    ):
        if value != plain:
            raise ConfigError(f"{flag} {value}: chooses the maps of --view maps, not of --view {view}")


def check_head(captioner, head: int) -> None:
    """One line for ``--head`` on a model without that head (before anything is written)."""
    from captioning.errors import ConfigError

    model = getattr(captioner, "model", None)
    if model is None or hasattr(model, "members"):
        raise ConfigError("--head: one model's heads; not an ONNX folder's or an ensemble's (--members each)")
    heads = int(getattr(model.decoder.config, "heads", 1))
    if heads < 2:
        raise ConfigError(f"--head: this model attends with one head (decoder.heads is {heads})")
    if not 0 <= head < heads:
        raise ConfigError(f"--head: expected a head in 0..{heads - 1} (the model has {heads} heads), got {head}")


@COMMANDS.register("attend")
class Attend(Command):
    help = (
        "write attention GIFs / grids: where the model looked for each word "
        "(several --checkpoint: the weighted mean of the models' maps, or each model's with --members each)"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("images", nargs="+", help=STREAM_HELP)
        generation_args(p)
        p.add_argument(
            "--out",
            required=True,
            help="FILE.gif / FILE.png for one image, else a folder (a name without a suffix, or an existing folder)",
        )
        p.add_argument(
            "--format",
            choices=("gif", "png", "both"),
            default=None,
            help="GIF (a frame per word), PNG grid (a panel per word) or both (default: the --out suffix, else gif)",
        )
        p.add_argument("--duration-ms", type=at_least(1), default=800, help="time per GIF frame")
        p.add_argument("--alpha", type=fraction, default=0.6, help="heatmap opacity")
        p.add_argument("--style", choices=("heatmap", "paper"), default="heatmap")
        p.add_argument(
            "--heads",
            choices=("mean", "each"),
            default="mean",
            help="multi-head models: the mean of the heads' maps, or a picture per head",
        )
        p.add_argument(
            "--head",
            type=int,
            default=None,
            help="multi-head models: draw head N's maps only (0 the first) instead of the heads' mean",
        )
        layer_arg(p, "drawn")
        p.add_argument(
            "--members",
            choices=("mean", "each"),
            default="mean",
            help="several --checkpoint: the models' weighted mean map (titled so), or a picture per model, titled",
        )
        p.add_argument(
            "--view",
            choices=("maps", "alignment", "self", "gate", "window", "sample"),
            default="maps",
            help="what to draw: each word's map (maps); the word-by-location matrix (alignment, a PNG); "
            "a Transformer's word-by-word or a grid refiner's self-attention (self, a PNG); beta_t beside "
            "each map (gate); a local window's centre and extent (window); hard attention's sampled cell "
            "beside its soft map (sample)",
        )
        focus_args(p)
        loader_args(p, batch_size=8)

    def run(self, args: argparse.Namespace) -> int:
        from tqdm import tqdm

        from captioning.data.inputs import load_batches, sized_pixels_of

        refuse_urls(args.images)
        out_kind(Path(args.out))  # a file suffix that is not .gif / .png: one line, before the model loads
        captioner = load_captioner(args)
        if args.layer is not None:
            from captioning.errors import ConfigError

            if getattr(captioner, "model", None) is None:
                raise ConfigError("--layer: chooses a transformer's layer; an ONNX folder holds no transformer")
            choose_layer(captioner.model, args.layer)
        if args.head is not None:
            check_head(captioner, args.head)
        check_view(captioner, args)
        if args.members == "each" and len(args.checkpoint) < 2:
            print(
                "note: --members each applies to several --checkpoint (an ensemble); this is one model", file=sys.stderr
            )
        sources, problems = listed_sources(args)
        fmt = args.format or (
            "png" if args.view in ("alignment", "self") and out_kind(Path(args.out)) == "folder" else None
        )
        targets = attend_targets([s.name for s in sources], Path(args.out), fmt) if sources else []
        for folder in {t.parent for files in targets for t, _ in files}:
            writable_folder(folder)
        overrides = {**generation_overrides(args), **focus_overrides(args)}
        if args.view == "sample":  # the cells hard attention samples from each word's soft map
            overrides["attention_mode"] = "sample"
        views = {"return_views": True} if args.view != "maps" else {}
        files_of = iter(targets)
        with tqdm(total=len(sources), desc="attend", unit="img", disable=None, file=sys.stderr) as bar:
            # each image as the model's pixels, its size and a copy at the pictures' size: a batch of
            # large photos holds no full-size pixels (data/inputs.py: sized_pixels)
            prepare = sized_pixels_of(captioner.input_sizes, display=True)
            for batch in load_batches(sources, prepare, args.batch_size, args.num_workers):
                if args.focus is not None:  # an image the box does not fit: reported below, the rest drawn
                    batch = focus_misfits(batch, args.focus, [])
                good = [b.image for b in batch if b.error is None]
                results = iter(
                    captioner.caption_pixels(
                        [g.pixels for g in good],
                        return_attention=True,
                        sizes=[g.size for g in good],
                        **views,
                        **overrides,
                    )
                    if good
                    else []
                )
                for item in batch:
                    files = next(files_of)
                    if item.error is not None:
                        problems.append((item.name, item.error))
                        continue
                    result = next(results)
                    if args.head is not None:  # one head's maps in the mean's place
                        result = {**result, "attention": result["head_attention"][:, args.head]}
                        result.pop("head_attention")
                    for target, fmt in files:
                        captioner.render(
                            item.image.display,
                            result,
                            target,
                            format=fmt,
                            duration_ms=args.duration_ms,
                            alpha=args.alpha,
                            style=args.style,
                            heads=args.heads,
                            members=args.members,
                            **({"view": args.view} if args.view != "maps" else {}),
                        )
                        print(
                            f"{printable(item.name)}\t{printable(result['generated_text'])}\t-> {printable(str(target))}",
                            flush=True,
                        )
                bar.update(len(batch))
        bad = problems
        report_problems(bad)
        return 1 if bad else 0
