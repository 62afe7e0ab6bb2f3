"""``captioning caption``: captions of image files, folders, glob patterns, @lists and WebDataset
shards, with a checkpoint (several: an ensemble) or an ONNX folder (onnxruntime, without PyTorch).

The images are a stream (data/inputs.py): read a batch at a time by the loader, captioned, written
(stdout, or appended to ``--out``: data/captions_out.py), then dropped."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.focus import focus_args, focus_misfits, focus_overrides
from captioning.cli.options import (
    STREAM_HELP,
    apply_image_limit,
    check_generation_flags,
    checkpoints_and_weights,
    counted,
    generation_args,
    generation_overrides,
    image_paths,
    loader_args,
    refuse_urls,
)
from captioning.errors import CaptioningError
from captioning.files import printable


def gather_images(items: Sequence[str]) -> tuple[list, list]:
    """(path, PIL image) of every readable image the arguments name (folders with their subfolders:
    :func:`~captioning.cli.options.image_paths`); (item, reason) for the others, an empty folder or a
    pattern that matches nothing included. None at all is a one-line error. Holds every image: the
    commands stream instead (:func:`stream_images`); kept for callers of a few images."""
    from captioning.data.images import load_images

    paths, empty = [], []
    for item in items:
        found = image_paths([item])
        if not found:
            empty.append((item, f"{item}: no images found (an empty folder, or a pattern that matches nothing)"))
        paths += found
    if not paths:
        raise CaptioningError(
            empty[0][1] if len(empty) == 1 else f"no images found in {', '.join(i for i, _ in empty)}"
        )
    good, bad = load_images(paths)
    return good, empty + bad


class ImageStream:
    """The images of a streaming command's arguments (data/inputs.py), read by its loader in batches,
    with a progress bar (images/s and, where the images were counted first, an ETA) on stderr.

    ``skip``: names not to read (a resumed --out's). Iterating gives lists of ``Loaded`` (name, image
    made ready by ``prepare``, error); afterwards ``problems`` counts (argument or image, reason) of
    everything that could not be read (data/inputs.py: Problems, the first few kept), ``listed`` the
    number of images the arguments named, and ``skipped`` the number of them in ``skip``."""

    def __init__(self, args, prepare=None, skip=(), desc: str = "captioning"):
        from captioning.data.inputs import Problems, check_items

        self.items = check_items(args.images)
        self.args, self.prepare, self.skip, self.desc = args, prepare, skip, desc
        self.encoded = False  # JPEGs as their bytes, for a GPU to decode (--decode-device)
        self.problems = Problems()
        self.empty = Problems()  # the arguments that name no image
        self.listed = self.skipped = 0

    def _sources(self):
        from captioning.data.inputs import iter_sources

        for source in iter_sources(self.items, inline=True):
            if source.error is not None:  # an argument that names no image
                self.empty.append((source.name, source.error))
                continue
            self.listed += 1
            if source.name in self.skip:
                self.skipped += 1
                continue
            yield source

    def _total(self) -> int | None:
        """The images to read, counted by a listing pass (only for a progress bar that shows)."""
        from captioning.data.inputs import Problems, iter_sources

        if not sys.stderr.isatty():
            return None
        return sum(1 for s in iter_sources(self.items, Problems(keep=0)) if s.name not in self.skip)

    def __iter__(self):
        from tqdm import tqdm

        from captioning.data.inputs import load_batches

        with tqdm(total=self._total(), desc=self.desc, unit="img", disable=None, file=sys.stderr) as bar:
            batches = load_batches(
                self._sources(), self.prepare, self.args.batch_size, self.args.num_workers, self.encoded
            )
            for batch in batches:
                self.problems += [(b.name, b.error) for b in batch if b.error is not None]
                yield batch
                bar.update(len(batch))
        self.problems += self.empty

    def check_found(self) -> None:
        """None of the arguments named an image: the one-line error of today's commands."""
        if self.listed == 0:
            more = f" and {self.empty.unshown:,} more" if self.empty.unshown else ""
            raise CaptioningError(
                self.empty[0][1]
                if len(self.empty) == 1
                else f"no images found in {', '.join(i for i, _ in self.empty)}{more}"
            )


def decode_on_device(captioner, batch: list, device, problems: list) -> list:
    """``caption --decode-device``: the batch's JPEG bytes decoded and resized on ``device``
    (data/images.py: decode_entries); an image none can decode becomes an error item, reported in
    ``problems`` as the loader's are."""
    from captioning.data.images import decode_entries
    from captioning.data.inputs import Loaded

    good = [b for b in batch if b.error is None]
    images, errors = decode_entries([b.image for b in good], [b.name for b in good], captioner.input_sizes, device)
    fixed = iter(Loaded(b.name, image, error) for b, image, error in zip(good, images, errors))
    problems += [(b.name, e) for b, e in zip(good, errors) if e is not None]
    return [next(fixed) if b.error is None else b for b in batch]


def caption_batch(captioner, loaded: list, **overrides) -> list[dict]:
    """The results of a batch's readable images: from the pixels the loader resized (a
    :class:`~captioning.api.Captioner`; with their images' sizes for a focus box), else from the
    images the loader resized (the ONNX captioner)."""
    from captioning.data.inputs import Sized

    images = [b.image for b in loaded]
    if not images:
        return []
    if isinstance(images[0], Sized):  # a focus box is in the pixels of the image's own size
        return captioner.caption_pixels([i.pixels for i in images], sizes=[i.size for i in images], **overrides)
    if hasattr(captioner, "caption_pixels"):
        return captioner.caption_pixels(images, **overrides)
    return captioner(images, **overrides)


def loader_prepare(captioner, focus: bool = False):
    """What the loader's workers make of each image for ``captioner``: its resized pixels (a
    Captioner; with ``focus`` also the image's size), or the image resized to the model's size (the
    ONNX captioner; its own resize of it is a copy). No batch holds an image's full pixels."""
    from captioning.data.inputs import model_image_of, model_pixels_of, sized_pixels_of

    if focus:
        return sized_pixels_of(captioner.input_sizes)
    if hasattr(captioner, "caption_pixels"):
        return model_pixels_of(captioner.input_sizes)
    return model_image_of(captioner.image_size, captioner.interpolation)


def load_captioner(args):
    """The checkpoint's Captioner (several --checkpoint: their ensemble's; with --onnx, the ONNX
    folder's OnnxCaptioner: no torch is imported then) and the generation settings of the command's
    arguments, checked before any image is read; a note when a hard-attention setting meets a soft model."""
    apply_image_limit(args)
    check_generation_flags(args)  # one-line errors in the flags' words, early; the note of implied flags
    paths, weights = checkpoints_and_weights(args)
    if getattr(args, "onnx", None):
        from captioning.export.onnx_captioner import OnnxCaptioner

        if args.device not in (None, "cpu"):
            print(f"note: --device {args.device} is ignored with --onnx (onnxruntime runs on the CPU)", file=sys.stderr)
        captioner = OnnxCaptioner(args.onnx)
        captioner.check_generation(
            captioner.generation.replace(**generation_overrides(args))
        )  # e.g. sampling: before any image
    else:
        from captioning.api import Captioner

        captioner = Captioner.from_checkpoints(paths, weights, args.device)
    if args.attention_mode not in (None, "expected") and captioner.attention_kind == "soft":
        print(
            f"note: --attention-mode {args.attention_mode} applies to hard-attention models; "
            "this one has soft attention (it reads the expected context)",
            file=sys.stderr,
        )
    if getattr(args, "attention_temperature", None) not in (None, 1.0) and captioner.attention_kind == "soft":
        print(
            "note: --attention-temperature applies to hard-attention models; "
            "this one has soft attention (it reads the expected context)",
            file=sys.stderr,
        )
    return captioner


@COMMANDS.register("caption")
class Caption(Command):
    help = "caption images (a stream: any number of them, appended to --out as they are made, resumable)"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("images", nargs="+", help=STREAM_HELP)
        generation_args(p, onnx=True)
        focus_args(p)
        p.add_argument("--json", action="store_true", help='print [{"image", "generated_text", "score"}, ...]')
        p.add_argument(
            "--out",
            metavar="FILE",
            default=None,
            help="append the captions to FILE as JSON lines (CSV if it ends in .csv), a batch at a time; "
            "run again with the same FILE to caption only the images not in it yet",
        )
        loader_args(p)
        p.add_argument(
            "--decode-device",
            default="cpu",
            metavar="DEVICE",
            help="where JPEGs are decoded and resized: cpu (the loader, with Pillow) or cuda "
            "(the GPU, with nvJPEG: for when the CPU cores are too few)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from captioning.data.captions_out import CaptionsFile, NameSet
        from captioning.data.images import check_decode_device

        refuse_urls(args.images)
        decode_device = check_decode_device(args.decode_device)  # no CUDA: one line, before anything is read
        if decode_device is not None and (getattr(args, "onnx", None) or args.focus is not None):
            raise CaptioningError(
                f"--decode-device {args.decode_device}: decodes for the PyTorch model "
                f"(not with {'--onnx' if getattr(args, 'onnx', None) else '--focus'}); use --decode-device cpu"
            )
        if args.out and args.json:
            raise CaptioningError("--json prints to stdout; with --out the captions go to the file (JSON lines or CSV)")
        out = CaptionsFile(args.out) if args.out else None
        done = out.check() if out else NameSet()  # this command's file or none: refused before the model loads
        stream = ImageStream(args, skip=done)  # a missing @list: one line, before the model loads
        if args.focus is not None and getattr(args, "onnx", None):
            raise CaptioningError("--focus needs the PyTorch model (the ONNX step graph takes no attention prior)")
        captioner = load_captioner(args)
        stream.prepare = loader_prepare(captioner, focus=args.focus is not None)
        if decode_device is not None:
            decode_device = captioner.check_decode_device(args.decode_device)  # the model's resize: one line
            stream.encoded = True
        overrides = {**generation_overrides(args), **focus_overrides(args)}
        grouped = (args.num_beam_groups or 1) > 1  # diverse beam search: every beam, labelled by its group
        if grouped:
            overrides["num_return_sequences"] = overrides["num_beams"]
        collected: list = []  # --json without --out: one array at the end, as before
        try:
            for batch in stream:
                if decode_device is not None:
                    batch = decode_on_device(captioner, batch, decode_device, stream.problems)
                if args.focus is not None:
                    batch = focus_misfits(batch, args.focus, stream.problems)
                results = iter(caption_batch(captioner, [b for b in batch if b.error is None], **overrides))
                rows = [
                    {"image": b.name, "error": b.error} if b.error else result_row(b.name, next(results), grouped)
                    for b in batch
                ]
                if out is not None:
                    out.append(rows)
                elif args.json:
                    collected += rows  # an image's error in its place
                else:
                    print_rows([r for r in rows if "error" not in r])
        finally:
            if out is not None:
                out.close()
        stream.check_found()
        if out is not None:
            return report_out(args.out, stream)
        bad = stream.problems
        if args.json:
            collected += [{"image": p, "error": reason} for p, reason in stream.empty]
            print_text(json.dumps(collected, indent=2, ensure_ascii=False))
        report_problems(bad)
        return 1 if bad else 0


def result_row(image: str, result: dict, grouped: bool) -> dict:
    """An image's line: {"image", "generated_text", "score"} (with diverse beam search, its "beams",
    labelled by group, best first within each)."""
    row = {"image": image, "generated_text": result["generated_text"], "score": result["score"]}
    if grouped:
        row["beams"] = sorted(
            (
                {"group": b.get("group", 1), "generated_text": b["generated_text"], "score": b["score"]}
                for b in result.get("beams", [])
            ),
            key=lambda b: (b["group"], -b["score"]),
        )
    return row


def print_rows(rows: list[dict]) -> None:
    """An image per line, ``NAME<TAB>CAPTION``: the name's and caption's control characters escaped
    (files.py: printable), so that a name holding a newline or a tab is one record, and a terminal
    is sent no escape sequence."""
    for row in rows:
        print(f"{printable(row['image'])}\t{printable(row['generated_text'])}", flush=True)
        for beam in row.get("beams", []):  # each group's beams, best first within the group
            print(f"  group {beam['group']}\t{beam['score']:.3f}\t{printable(beam['generated_text'])}")


def print_text(text: str) -> None:
    """``text`` on stdout; names that are not UTF-8 keep their bytes (as in an --out file), where
    stdout's own encoding cannot write them."""
    try:
        print(text, flush=True)
    except UnicodeEncodeError:
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape") + b"\n")
        sys.stdout.buffer.flush()


def report_problems(bad) -> None:
    """The images that could not be read, on stderr: the first few (data/inputs.py: Problems keeps
    them), how many more, and the count."""
    for _, reason in bad:
        print(f"skipped: {reason}", file=sys.stderr)
    if getattr(bad, "unshown", 0):
        print(f"skipped: ... and {counted(bad.unshown, 'more image')}", file=sys.stderr)
    if bad:
        print(f"{counted(len(bad), 'image')} skipped", file=sys.stderr)


def report_out(out: str, stream: ImageStream) -> int:
    """The end of a run with --out: what was skipped as already there, one line for the images that
    could not be read (their lines in the file hold the reasons), and a summary line (captions
    written, where), all on stderr (stdout stays empty: the captions are in the file); 1 if any
    image could not be read."""
    if stream.skipped:
        print(f"{counted(stream.skipped, 'image')} already in {out}: not captioned again", file=sys.stderr)
    bad = stream.problems
    if bad:
        print(
            f"{counted(len(bad), 'image')} could not be read ({bad[0][1]}{' ...' if len(bad) > 1 else ''}); "
            f'the lines of {out} with an "error" say why',
            file=sys.stderr,
        )
    unread = len(bad) - len(stream.empty)  # images that could not be read (an argument naming none is no line)
    written = stream.listed - stream.skipped - unread
    besides = [f"{counted(stream.skipped, 'image')} already there"] * bool(stream.skipped)
    besides += [f"{unread:,} unreadable, with their reasons"] * bool(unread)
    print(
        f"wrote {counted(written, 'caption')} to {out}" + (f" ({', '.join(besides)})" if besides else ""),
        file=sys.stderr,
    )
    return 1 if bad else 0
