"""``captioning caption``: captions of image files, folders and glob patterns, with a checkpoint
(several: an ensemble) or an ONNX folder (onnxruntime, without PyTorch)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import (
    IMAGES_HELP,
    apply_image_limit,
    check_generation_flags,
    checkpoints_and_weights,
    generation_args,
    generation_overrides,
    image_paths,
    refuse_urls,
    report_skipped,
)
from captioning.errors import CaptioningError


def gather_images(items: Sequence[str]) -> tuple[list, list]:
    """(path, PIL image) of every readable image the arguments name (folders with their subfolders:
    :func:`~captioning.cli.options.image_paths`); (item, reason) for the others, an empty folder or a
    pattern that matches nothing included. None at all is a one-line error."""
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
    help = "caption images"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("images", nargs="+", help=IMAGES_HELP)
        generation_args(p, onnx=True)
        p.add_argument("--json", action="store_true", help='print [{"image", "generated_text", "score"}, ...]')

    def run(self, args: argparse.Namespace) -> int:
        refuse_urls(args.images)
        captioner = load_captioner(args)
        good, bad = gather_images(args.images)
        overrides = generation_overrides(args)
        grouped = (args.num_beam_groups or 1) > 1  # diverse beam search: every beam, labelled by its group
        if grouped:
            overrides["num_return_sequences"] = overrides["num_beams"]
        results = captioner([im for _, im in good], **overrides) if good else []
        rows = [
            {"image": p, "generated_text": r["generated_text"], "score": r["score"]} for (p, _), r in zip(good, results)
        ]
        if grouped:
            for row, result in zip(rows, results):
                row["beams"] = sorted(
                    (
                        {"group": b.get("group", 1), "generated_text": b["generated_text"], "score": b["score"]}
                        for b in result.get("beams", [])
                    ),
                    key=lambda b: (b["group"], -b["score"]),
                )
        if args.json:
            rows += [{"image": p, "error": reason} for p, reason in bad]
            print(json.dumps(rows, indent=2, ensure_ascii=False))
        else:
            for row in rows:
                print(f"{row['image']}\t{row['generated_text']}")
                for beam in row.get("beams", []):  # each group's beams, best first within the group
                    print(f"  group {beam['group']}\t{beam['score']:.3f}\t{beam['generated_text']}")
        report_skipped(bad)
        return 1 if bad else 0
