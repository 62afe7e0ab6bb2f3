"""The ``captioning`` command.

Training goes through LightningCLI (``fit``, ``validate``, ``test``: ``--config``, ``--print_config``,
``--model.x`` / ``--data.x`` / ``--trainer.x`` overrides); everything else is a plain subcommand.
User errors end in one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

from captioning.errors import CaptioningError
from captioning import __version__
from captioning.cli.options import (ShortErrorParser, apply_image_limit, at_least, checkpoints_and_weights, fraction,
                                    generation_args, generation_overrides, report_skipped)

#: the LightningCLI subcommands (captioning/training/cli.py)
TRAINING_COMMANDS = ("fit", "validate", "test")



def cmd_make_shapes(args) -> int:
    from captioning.data.shapes import generate

    path = generate(args.out, n_train=args.train, n_val=args.val, n_test=args.test, seed=args.seed, image_size=args.image_size,
                    preset=args.preset)
    print(f"wrote {path}")
    return 0


def gather_images(items: Sequence[str]) -> tuple[list, list]:
    """(path, PIL image) of every readable image the arguments name; (item, reason) for the others,
    an empty folder or a pattern that matches nothing included. None at all is a one-line error."""
    from captioning.data.images import expand_image_paths, load_images

    paths, empty = [], []
    for item in items:
        found = expand_image_paths([item])
        if not found:
            empty.append((item, f"{item}: no images found (an empty folder, or a pattern that matches nothing)"))
        paths += found
    if not paths:
        raise CaptioningError(empty[0][1] if len(empty) == 1 else f"no images found in {', '.join(i for i, _ in empty)}")
    good, bad = load_images(paths)
    return good, empty + bad


def load_captioner(args):
    """The checkpoint's Captioner (several --checkpoint: their ensemble's; with --onnx, the ONNX
    folder's OnnxCaptioner: no torch is imported then) and the generation settings of the command's
    arguments, checked before any image is read; a note when a hard-attention setting meets a soft model."""
    from captioning.decoding.generation import GenerationConfig

    apply_image_limit(args)
    GenerationConfig(num_beams=args.num_beams).replace(**generation_overrides(args))  # one-line errors, early
    paths, weights = checkpoints_and_weights(args)
    if getattr(args, "onnx", None):
        from captioning.export.onnx_captioner import OnnxCaptioner

        if args.device not in (None, "cpu"):
            print(f"note: --device {args.device} is ignored with --onnx (onnxruntime runs on the CPU)", file=sys.stderr)
        captioner = OnnxCaptioner(args.onnx)
        captioner.check_generation(captioner.generation.replace(**generation_overrides(args)))  # e.g. sampling: before any image
    else:
        from captioning.api import Captioner

        captioner = Captioner.from_checkpoints(paths, weights, args.device)
    if args.attention_mode not in (None, "expected") and captioner.attention_kind == "soft":
        print(f"note: --attention-mode {args.attention_mode} applies to hard-attention models; "
              "this one has soft attention (it reads the expected context)", file=sys.stderr)
    if getattr(args, "attention_temperature", None) not in (None, 1.0) and captioner.attention_kind == "soft":
        print(f"note: --attention-temperature applies to hard-attention models; "
              "this one has soft attention (it reads the expected context)", file=sys.stderr)
    return captioner


def cmd_caption(args) -> int:
    captioner = load_captioner(args)
    good, bad = gather_images(args.images)
    overrides = generation_overrides(args)
    grouped = (args.num_beam_groups or 1) > 1  # diverse beam search: every beam, labelled by its group
    if grouped:
        overrides["num_return_sequences"] = args.num_beams
    results = captioner([im for _, im in good], **overrides) if good else []
    rows = [{"image": p, "generated_text": r["generated_text"], "score": r["score"]} for (p, _), r in zip(good, results)]
    if grouped:
        for row, result in zip(rows, results):
            row["beams"] = sorted(({"group": b.get("group", 1), "generated_text": b["generated_text"], "score": b["score"]}
                                   for b in result.get("beams", [])), key=lambda b: (b["group"], -b["score"]))
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


def attend_targets(paths: Sequence[str], out: Path, fmt: Optional[str]) -> list[list[tuple[Path, str]]]:
    """The files to write for each image: [(path, format), ...] per image.

    ``out`` ending in .gif / .png is one file for one image (``fmt`` must agree); otherwise a folder,
    where each image gets <stem>.<format>, or <stem>.<source extension>.<format> when two sources share
    a stem (photo.jpg and photo.png), numbered if still not unique: nothing is overwritten by its sibling.
    """
    suffix = out.suffix.lower()
    if suffix in (".gif", ".png"):
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


def writable_folder(folder: Path) -> None:
    """Create ``folder`` if needed; a one-line error if it cannot be made or written to."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise CaptioningError(f"{folder}: cannot write there ({err.strerror or err})") from None


def cmd_attend(args) -> int:
    captioner = load_captioner(args)
    if args.members == "each" and len(args.checkpoint) < 2:
        print("note: --members each applies to several --checkpoint (an ensemble); this is one model", file=sys.stderr)
    good, bad = gather_images(args.images)
    targets = attend_targets([p for p, _ in good], Path(args.out), args.format) if good else []
    for folder in {t.parent for files in targets for t, _ in files}:
        writable_folder(folder)
    results = captioner([im for _, im in good], return_attention=True, **generation_overrides(args)) if good else []
    for (path, image), result, files in zip(good, results, targets):
        for target, fmt in files:
            captioner.render(image, result, target, format=fmt, duration_ms=args.duration_ms, alpha=args.alpha, style=args.style,
                            heads=args.heads, members=args.members)
            print(f"{path}\t{result['generated_text']}\t-> {target}")
    report_skipped(bad)
    return 1 if bad else 0


def cmd_evaluate(args) -> int:
    from captioning.cli.evaluate import evaluate
    from captioning.storage.load import load_model

    apply_image_limit(args)
    paths, weights = checkpoints_and_weights(args)
    if args.server_results:  # its settings checked now, not after decoding the whole split
        from captioning.cli.evaluate import server_file

        server_file(args.server_results, args.server_subset, args.server_name, args.server_dir)
    if len(paths) == 1 and weights is None:
        model = load_model(paths[0])
    else:  # an ensemble: its members' log-probabilities averaged (decoding/ensemble.py)
        from captioning.decoding.ensemble import Ensemble

        model = Ensemble([load_model(p) for p in paths], weights, names=paths)
    report = evaluate(
        model, args.annotations, images_root=args.images_root, split=args.split,
        generation=model.spec.generation.replace(**generation_overrides(args)),
        batch_size=args.batch_size, num_workers=args.num_workers, device=args.device, spice=args.spice,
        grounding=args.grounding, metrics_path=args.out, results_path=args.results, checkpoint=" + ".join(paths),
        clip_model=args.clip_model, clip_weights=args.clip_weights,
    )
    print(json.dumps(report["scores"], indent=2))
    if args.server_results:
        from captioning.cli.evaluate import write_server_results

        path = write_server_results(report["predictions"], args.server_results, args.server_subset, args.server_name,
                                    args.server_dir)
        print(f"wrote {path} (submit it to the {args.server_results} evaluation server)", file=sys.stderr)
    for key, note in report["notes"].items():
        if key.endswith("_error"):  # a metric that could not be computed, and why
            print(f"note: {note}", file=sys.stderr)
    for p in report.get("skipped", []):
        print(f"skipped: {p}", file=sys.stderr)
    return 1 if report.get("skipped") else 0


def cmd_export(args) -> int:
    import os

    from captioning.cli.export import export
    from captioning.storage.folder import folder_summary

    if os.path.isfile(args.out):
        raise CaptioningError(f"--out {args.out}: a file, not a folder")
    if os.path.isdir(args.out) and any(not p.startswith(".") for p in os.listdir(args.out)) and not args.overwrite:
        raise CaptioningError(f"--out {args.out}: the folder exists and is not empty (pass --overwrite to write into it)")
    folder = export(args.checkpoint, args.out, format=args.format, metrics=args.metrics, opset=args.opset)
    files = folder_summary(folder)
    source = os.path.getsize(args.checkpoint) if os.path.isfile(args.checkpoint) else None

    def size(n: int) -> str:
        return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"

    for name, n in files.items():
        print(f"{folder / name}\t{size(n)}")
    print(f"wrote {folder}: {size(sum(files.values()))}" + (f" (the checkpoint: {size(source)})" if source else ""))
    return 0


def cmd_demo(args) -> int:
    from captioning.cli.demo import run_demo

    run_demo(args.out, seed=args.seed, max_epochs=args.max_epochs)
    return 0


def cmd_prepare(args) -> int:
    from captioning.cli.prepare import prepare

    annotations = args.annotations[0] if len(args.annotations) == 1 else args.annotations
    return prepare(annotations, images_root=args.images_root, min_word_freq=args.min_word_freq, out=args.out,
                   split_file=args.split_file, max_vocab_size=args.max_vocab_size, check=not args.no_image_check,
                   to_webdataset=args.to_webdataset, shard_size=args.shard_size)


def cmd_extract_features(args) -> int:
    from captioning.cli.extract import extract_from_config, parse_shard

    overrides = []
    if args.annotations:
        overrides += ["--data.annotations", args.annotations[0] if len(args.annotations) == 1 else json.dumps(args.annotations)]
    if args.images_root:
        overrides += ["--data.images_root", args.images_root]
    if args.split_file:
        overrides += ["--data.split_file", args.split_file]
    report = extract_from_config(args.config, args.out, batch_size=args.batch_size, num_workers=args.num_workers,
                                 shard=parse_shard(args.shard), overrides=overrides, device=args.device)
    for message in report["unreadable"]:
        print(f"unreadable: {message}", file=sys.stderr)
    print(f"{report['part']}: {report['done']} of {report['rows']} images done ({report['extracted']} this run)")
    return 0 if report["done"] == report["rows"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = ShortErrorParser(
        prog="captioning",
        description="Show, Attend and Tell image captioning.",
    )
    parser.add_argument("--version", action="version", version=f"captioning {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command", parser_class=ShortErrorParser)
    for name, what in (("fit", "train a model from a config (LightningCLI: `captioning fit --help`)"),
                       ("validate", "validation scores of a checkpoint (LightningCLI)"),
                       ("test", "test-split scores of a checkpoint (LightningCLI)")):
        sub.add_parser(name, help=what, add_help=False)  # listed here; main() hands them to LightningCLI

    p = sub.add_parser("demo", help="make shapes data, train, evaluate, caption, write GIFs")
    p.add_argument("--out", default="outputs/demo", help="the folder for everything the demo writes")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of training")
    p.add_argument("--max-epochs", type=at_least(1), default=None, help="override the demo's training length")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("make-shapes", help="generate the synthetic shapes dataset")
    p.add_argument("--out", required=True, help="folder for dataset_shapes.json and images/")
    p.add_argument("--train", type=at_least(1), default=4000, help="training images")
    p.add_argument("--val", type=at_least(1), default=200, help="validation images")
    p.add_argument("--test", type=at_least(1), default=300, help="test images")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--image-size", type=at_least(16), default=64, help="side of the square images, in pixels")
    p.add_argument("--preset", choices=("demo", "hard"), default="demo",
                   help="demo: 1-4 objects on a gradient, PNG (the demo's data); hard: 2-4 objects of 3 sizes, "
                        "8 colours, 6 shapes on textured backgrounds, JPEG")
    p.set_defaults(func=cmd_make_shapes)

    p = sub.add_parser("caption", help="caption images")
    p.add_argument("images", nargs="+", help="image files, folders or glob patterns")
    generation_args(p, onnx=True)
    p.add_argument("--json", action="store_true", help='print [{"image", "generated_text", "score"}, ...]')
    p.set_defaults(func=cmd_caption)

    p = sub.add_parser("attend", help="write attention GIFs / grids: where the model looked for each word "
                       "(several --checkpoint: the weighted mean of the models' maps, or each model's with --members each)")
    p.add_argument("images", nargs="+", help="image files, folders or glob patterns")
    generation_args(p)
    p.add_argument("--out", required=True, help="FILE.gif / FILE.png for one image, else a folder")
    p.add_argument("--format", choices=("gif", "png", "both"), default=None,
                   help="GIF (a frame per word), PNG grid (a panel per word) or both (default: the --out suffix, else gif)")
    p.add_argument("--duration-ms", type=at_least(1), default=800, help="time per GIF frame")
    p.add_argument("--alpha", type=fraction, default=0.6, help="heatmap opacity")
    p.add_argument("--style", choices=("heatmap", "paper"), default="heatmap")
    p.add_argument("--heads", choices=("mean", "each"), default="mean",
                   help="multi-head models: the mean of the heads' maps, or a picture per head")
    p.add_argument("--members", choices=("mean", "each"), default="mean",
                   help="several --checkpoint: the models' weighted mean map (titled so), or a picture per model, titled")
    p.set_defaults(func=cmd_attend)

    p = sub.add_parser("evaluate", help="coco-caption scores of a checkpoint on a split")
    generation_args(p)
    p.add_argument("--annotations", required=True, help="Karpathy-format annotation file")
    p.add_argument("--images-root", default=None, help="folder the image paths are relative to (default: the annotation file's)")
    p.add_argument("--split", default="test")
    p.add_argument("--batch-size", type=at_least(1), default=32)
    p.add_argument("--num-workers", type=at_least(0), default=0)
    p.add_argument("--spice", action="store_true", help="also try SPICE (needs Java and Stanford CoreNLP)")
    p.add_argument("--clip-model", default=None, metavar="MODEL[/TAG]",
                   help="CLIPScore and RefCLIPScore with this OpenCLIP model (e.g. ViT-B-32/openai; weights from its cache)")
    p.add_argument("--clip-weights", default=None, metavar="FILE",
                   help="the CLIP model's weights from a local safetensors or weights-only file instead of its cache")
    p.add_argument("--grounding", action="store_true", help="attention grounding scores (datasets with boxes)")
    p.add_argument("--out", default=None, help="write the metrics JSON here")
    p.add_argument("--results", default=None, help="write the COCO results JSON here")
    p.add_argument("--server-results", choices=("coco", "nocaps"), default=None,
                   help="also write the captions as an evaluation server's submission file (docs/EVALUATION.md)")
    p.add_argument("--server-subset", default=None,
                   help="the server's subset: coco val2014 (default) or test2014; nocaps val (default) or test")
    p.add_argument("--server-name", default="captioning", help="the method's name in the submission file's name")
    p.add_argument("--server-dir", default=".", help="the folder the submission file is written to")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("prepare", help="check a dataset (splits, images, caption lengths) and build its vocabulary")
    p.add_argument("--annotations", required=True, nargs="+",
                   help="Karpathy split JSON, COCO caption JSON file(s), or a captions .csv / .jsonl")
    p.add_argument("--images-root", default=None, help="folder the image paths are relative to (default: the annotation file's)")
    p.add_argument("--split-file", default=None, help="for COCO caption files: Karpathy's dataset_coco.json")
    p.add_argument("--min-word-freq", type=at_least(1), default=5, help="rarer training words become <unk>")
    p.add_argument("--max-vocab-size", type=at_least(0), default=None)
    p.add_argument("--out", default=None, help="write the vocabulary JSON here (train with it: --data.vocabulary FILE)")
    p.add_argument("--no-image-check", action="store_true", help="skip reading every image")
    p.add_argument("--to-webdataset", default=None, metavar="OUT",
                   help="then write the dataset as WebDataset shards OUT/{split}-NNNNNN.tar (train with --data.annotations OUT)")
    p.add_argument("--shard-size", type=at_least(1), default=1000, help="images per shard (--to-webdataset)")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("export", help="write a model folder to share (safetensors + config.json + vocab.json + "
                                      "model card), or ONNX graphs that caption without PyTorch")
    p.add_argument("--checkpoint", required=True, help="a checkpoint written by `captioning fit` (or a model folder)")
    p.add_argument("--out", required=True, help="the model folder to write")
    p.add_argument("--format", choices=("safetensors", "onnx"), default="safetensors",
                   help="safetensors: weights for Captioner.from_pretrained / --checkpoint; onnx: encoder.onnx and "
                        "decoder_step*.onnx for `caption --onnx` and OnnxCaptioner (default: safetensors)")
    p.add_argument("--metrics", default=None, help="a report of `captioning evaluate --out`: its test scores go in the model card")
    p.add_argument("--opset", type=at_least(13), default=17, help="ONNX opset (with --format onnx)")
    p.add_argument("--overwrite", action="store_true", help="write into a folder that is not empty")
    p.set_defaults(func=cmd_export)

    from captioning.web.cli import add_serve_parser

    add_serve_parser(sub)  # `captioning serve`: the web page and HTTP API (the `web` extra)

    p = sub.add_parser("extract-features", help="run a config's frozen encoder once over all images into a feature cache")
    p.add_argument("--config", required=True, help="a training config: its model section picks the encoder")
    p.add_argument("--out", required=True, help="the cache folder (train with --data.features FOLDER)")
    p.add_argument("--annotations", nargs="+", default=None, help="override the config's data.annotations")
    p.add_argument("--images-root", default=None, help="override the config's data.images_root")
    p.add_argument("--split-file", default=None, help="override the config's data.split_file")
    p.add_argument("--batch-size", type=at_least(1), default=64)
    p.add_argument("--num-workers", type=at_least(0), default=4)
    p.add_argument("--shard", default="0/1", help="i/n: this process extracts every n-th image from the i-th")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1... (default: cuda if available)")
    p.set_defaults(func=cmd_extract_features)
    return parser


def _captioning_cause(err: BaseException) -> Optional[CaptioningError]:
    """The first of our own errors in ``err``'s chain of causes (None when there is none)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, CaptioningError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "predict":
            raise CaptioningError("`captioning predict` is not a command: caption images or folders with "
                                  "`captioning caption IMAGES --checkpoint CKPT`, a whole split with `captioning evaluate`")
        if argv and argv[0] in TRAINING_COMMANDS:
            from captioning.training.cli import run_lightning_cli

            run_lightning_cli(argv)
            return 0
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return args.func(args)
    except CaptioningError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # e.g. jsonargparse wraps an objective's ConfigError in a ValueError of many lines
        cause = _captioning_cause(err)
        if cause is None:
            raise
        print(f"error: {cause}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
