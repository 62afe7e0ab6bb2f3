"""``captioning evaluate``: a checkpoint's coco-caption scores on a split, from the images.

The decoding and the scoring (every registered metric: captioning/metrics/metric.py) are the
:class:`~captioning.evaluation.evaluator.Evaluator`'s, as in validation and ``captioning test``; this file
adds the plain loop over the split, the COCO results file and the report. Unreadable images are
skipped, reported by name and counted; the rest are scored. The captions are written before they
are scored, so a scorer failure never loses them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import (
    apply_image_limit,
    at_least,
    check_generation_flags,
    checkpoints_and_weights,
    choose_layer,
    generation_args,
    layer_arg,
)
from captioning.common import default_device
from captioning.decoding.generation import GenerationConfig
from captioning.errors import ConfigError
from captioning.files import atomic_write_json

if TYPE_CHECKING:
    from captioning.data.captions import CaptionData


def evaluate(
    model,
    annotations: str,
    images_root: str | None = None,
    split: str = "test",
    generation: GenerationConfig | None = None,
    batch_size: int = 32,
    num_workers: int = 0,
    device: str | None = None,
    spice: bool = False,
    grounding: bool = False,
    metrics_path: str | None = None,
    results_path: str | None = None,
    checkpoint: str | None = None,
    progress: bool = True,
    clip_model: str | None = None,
    clip_weights: str | None = None,
    metrics: Sequence[str] | None = None,
    tokenizer: str = "auto",
    instances: str | dict | None = None,
    per_image_path: str | None = None,
    faithfulness: bool = False,
    faithfulness_images: int | None = None,
) -> dict:
    """Decode ``split`` with a trained model and score it. Returns the report written to ``metrics_path``,
    with the captions themselves added ("predictions": {image_id: caption}).

    ``model``: a ShowAttendTell with its ``spec`` (storage/load.py's load_model gives one), whose
    image size the images are resized to, or a trained CaptioningModule (its model is taken).
    ``generation``: the decoding settings (default: the spec's, the model's test decoding). The report holds
    "scores" (every registered metric's: BLEU-1..4, METEOR, ROUGE_L, CIDEr, SPICE when it can run, object
    F1 for datasets with object annotations, grounding scores if asked, ...), "notes" (why a metric is missing), the
    decoding settings and the images skipped. ``results_path`` gets the COCO results file
    [{"image_id", "caption"}], each image named by the dataset's own id (AI Challenger: its file name;
    evaluation/results_files.py's results_items). ``clip_model`` (``MODEL/TAG``, or ``MODEL`` with ``clip_weights``, a
    local file): CLIPScore and RefCLIPScore (metrics/clip_score.py), or a note saying why not.
    ``metrics`` and ``tokenizer``: the coco-caption scores to compute (None: BLEU, METEOR, ROUGE_L, CIDEr) and the PTB tokenizer ("auto":
    Java where present; "python": metrics/ptb.py's, the same tokens without a JVM), as the Evaluator takes them.
    ``instances``: a COCO instances file for CHAIR (metrics/chair.py); ``per_image_path``: every image's
    scores, caption and references as JSON lines (:func:`write_per_image`). The scoring is
    :func:`~captioning.evaluation.split_scores.score_split`'s, which ``captioning score`` calls too.
    Shapes data made with ``--holdout`` adds "novel_pairs" (the test_novel split's held-out pairs);
    ``faithfulness`` adds "faithfulness" over ``faithfulness_images`` images of the split
    (evaluation/attention_reports.py).
    """
    from tqdm.auto import tqdm

    from captioning.data.captions import CaptionData
    from captioning.evaluation.attention_reports import attention_reports
    from captioning.evaluation.evaluator import Evaluator
    from captioning.evaluation.results_files import dataset_ids, results_items
    from captioning.evaluation.split_scores import score_split, split_images, training_captions
    from captioning.fast import fast_model
    from captioning.metrics.clip_score import ClipScoring
    from captioning.models.transformer import attention_layer_field

    model = getattr(model, "model", model)  # a CaptioningModule holds its ShowAttendTell as .model
    generation = generation or model.spec.generation
    dev = default_device(device)
    model = fast_model(model.eval().to(dev))  # its fast twin, where it has one (captioning/fast/)
    data = CaptionData(
        annotations,
        images_root,
        eval_batch_size=batch_size,
        num_workers=num_workers,
        image_size=model.spec.image_size,
        on_bad_image="skip",
        interpolation=model.spec.interpolation or "bilinear",
    )
    data.set_vocab(model.vocab)
    evaluator = Evaluator(
        metrics,
        spice=spice,
        keep_alignments=grounding,
        training_captions=training_captions(data),
        tokenizer=tokenizer,
        clip=ClipScoring(clip_model, clip_weights, str(dev)),
    )

    start = time.perf_counter()
    skipped = []
    for batch in tqdm(
        data.eval_dataloader(split), desc=f"decoding {split}", unit="batch", disable=None if progress else True
    ):
        skipped += batch.pop("bad_images")  # unreadable images, named with the reason; the rest go on
        if batch["image_ids"].numel():
            evaluator.add(model, {k: v.to(dev) for k, v in batch.items()}, generation)
    decode_seconds = time.perf_counter() - start
    predictions = evaluator.predictions(model.vocab)
    if results_path:
        atomic_write_json(results_path, results_items(predictions, dataset_ids(data)))  # the dataset's own ids

    try:
        scored = score_split(evaluator, data, split, predictions, instances, images=split_images(data, split))
    finally:
        evaluator.close()
    scores, notes = scored.scores, scored.notes
    if per_image_path:
        write_per_image(per_image_path, scored.rows(predictions, data.references(split)))
    if predictions and not spice:
        notes.setdefault("SPICE", "not computed (pass --spice; it needs Java and a Stanford CoreNLP download)")
    report = {
        "checkpoint": os.fspath(checkpoint) if checkpoint else None,
        "annotations": os.fspath(annotations),
        "split": split,
        "num_images": len(predictions),
        "attention_kind": model.attention_kind,
        **attention_layer_field(model),
        "generation": {k: v for k, v in vars(generation).items()},
        "decode_seconds": round(decode_seconds, 2),
        "scores": scores,
        "notes": notes,
        "skipped": skipped,
    }
    report.update(
        attention_reports(model, data, annotations, split, generation, dev, faithfulness, faithfulness_images)
    )
    if metrics_path:
        atomic_write_json(metrics_path, report)
    report["predictions"] = predictions  # (not in the metrics file: the results file holds them)
    return report


def write_per_image(path: str, rows: list[dict]) -> None:
    """One JSON object per line and image (SplitScores.rows), written whole or not at all."""
    from captioning.files import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def clip_scores(
    scores: dict,
    notes: dict,
    data: CaptionData,
    split: str,
    predictions: dict,
    clip_model: str | None,
    clip_weights: str | None,
    device: str,
) -> None:
    """CLIPScore and RefCLIPScore of the captions into ``scores``, or into ``notes`` why they are missing
    (the data is read only once a CLIP model has loaded). ``evaluate`` has its Evaluator compute them."""
    from captioning.evaluation.split_scores import split_images
    from captioning.metrics.clip_score import ClipScoring

    clip = ClipScoring(clip_model, clip_weights, device)
    if clip.scorer() is None:
        notes["CLIPScore"] = clip.missing
        return
    got, _ = clip(split_images(data, split), predictions, data.references(split))
    scores.update(got)


#: the decimals of the scores evaluate prints (the --out report keeps every digit)
SHOWN_DECIMALS = 4


def shown_scores(scores: dict) -> dict:
    """The scores as printed: numbers rounded to :data:`SHOWN_DECIMALS` decimals (a BLEU-4 of
    6.666666666222223e-17 is 0.0), anything else as it is."""
    return {k: round(v, SHOWN_DECIMALS) if isinstance(v, float) else v for k, v in scores.items()}


#: an evaluation server's subsets, and the name its submission file must have
SERVER_FILES = {
    "coco": (("val2014", "test2014"), "captions_{subset}_{name}_results.json"),  # the COCO caption server's convention
    "nocaps": (("val", "test"), "nocaps_{subset}_{name}_results.json"),
}


def server_file(server: str, subset: str | None = None, name: str = "captioning", folder: str = ".") -> str:
    """The path of an evaluation server's submission file (:data:`SERVER_FILES`); one line of
    :class:`ConfigError` for a subset the server does not have or a name that cannot be a file name."""
    subsets, pattern = SERVER_FILES[server]
    subset = subset or subsets[0]
    if subset not in subsets:
        raise ConfigError(f"--server-subset: the {server} server's subsets are {', '.join(subsets)}, got {subset!r}")
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ConfigError(
            f"--server-name: letters, digits, '-' and '_' only (it is part of the file name), got {name!r}"
        )
    return os.path.join(folder, pattern.format(subset=subset, name=name))


def write_server_results(
    predictions: dict, server: str, subset: str | None = None, name: str = "captioning", folder: str = "."
) -> str:
    """The captions as an evaluation server's submission: a JSON list of {"image_id": int, "caption": str},
    one per image, in the file :func:`server_file` names. Returns its path."""
    path = server_file(server, subset, name, folder)
    if not predictions:
        raise ConfigError("no captions to submit (no image of the split was decoded)")
    atomic_write_json(path, [{"image_id": int(i), "caption": c} for i, c in sorted(predictions.items())])
    return path


def score_args(p: argparse.ArgumentParser) -> None:
    """The flags ``evaluate`` and ``score`` share: CHAIR's instances file and the per-image scores."""
    p.add_argument(
        "--instances",
        default=None,
        metavar="FILE",
        help="COCO instances file (instances_val2014.json): CHAIR-i, CHAIR-s and object recall (docs/EVALUATION.md)",
    )
    p.add_argument(
        "--per-image",
        default=None,
        metavar="FILE.jsonl",
        help="write every image's scores, caption and references here, one JSON object a line",
    )


@COMMANDS.register("evaluate")
class Evaluate(Command):
    help = "coco-caption scores of a checkpoint on a split"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        generation_args(p)
        p.add_argument("--annotations", required=True, help="Karpathy-format annotation file")
        p.add_argument(
            "--images-root",
            default=None,
            help="folder the image paths are relative to (default: the annotation file's)",
        )
        p.add_argument("--split", default="test")
        p.add_argument("--batch-size", type=at_least(1), default=32)
        p.add_argument("--num-workers", type=at_least(0), default=0)
        p.add_argument("--spice", action="store_true", help="also try SPICE (needs Java and Stanford CoreNLP)")
        p.add_argument(
            "--clip-model",
            default=None,
            metavar="MODEL[/TAG]",
            help="CLIPScore and RefCLIPScore with this OpenCLIP model (e.g. ViT-B-32/openai; weights from its cache)",
        )
        p.add_argument(
            "--clip-weights",
            default=None,
            metavar="FILE",
            help="the CLIP model's weights from a local safetensors or weights-only file instead of its cache",
        )
        p.add_argument("--grounding", action="store_true", help="attention grounding scores (datasets with boxes)")
        layer_arg(p, "scored (grounding, faithfulness) and written to the results")
        p.add_argument(
            "--faithfulness",
            action="store_true",
            help="deletion/insertion curves of the attended annotation vectors per word (docs/EVALUATION.md)",
        )
        p.add_argument(
            "--faithfulness-images", type=at_least(1), default=None, help="--faithfulness over the first N images only"
        )
        p.add_argument(
            "--out", default=None, help="write the metrics JSON here (every digit; printed scores have 4 decimals)"
        )
        p.add_argument("--results", default=None, help="write the COCO results JSON here")
        score_args(p)
        p.add_argument(
            "--server-results",
            choices=("coco", "nocaps"),
            default=None,
            help="also write the captions as an evaluation server's submission file (docs/EVALUATION.md)",
        )
        p.add_argument(
            "--server-subset",
            default=None,
            help="the server's subset: coco val2014 (default) or test2014; nocaps val (default) or test",
        )
        p.add_argument("--server-name", default="captioning", help="the method's name in the submission file's name")
        p.add_argument("--server-dir", default=".", help="the folder the submission file is written to")

    def run(self, args: argparse.Namespace) -> int:
        from captioning.evaluation.attention_reports import attention_summary
        from captioning.storage.load import load_model

        apply_image_limit(args)
        paths, weights = checkpoints_and_weights(args)
        instances = None
        if args.instances:  # checked now, not after decoding the whole split
            from captioning.metrics.chair import read_instances

            instances = read_instances(args.instances)
        if args.server_results:  # its settings checked now, not after decoding the whole split
            server_file(args.server_results, args.server_subset, args.server_name, args.server_dir)
        if len(paths) == 1 and weights is None:
            model = load_model(paths[0])
        else:  # an ensemble: its members' log-probabilities averaged (decoding/ensemble.py)
            from captioning.decoding.ensemble import Ensemble

            model = Ensemble([load_model(p) for p in paths], weights, names=paths)
        choose_layer(model, args.layer)
        report = evaluate(
            model,
            args.annotations,
            images_root=args.images_root,
            split=args.split,
            generation=check_generation_flags(args, model.spec.generation),
            batch_size=args.batch_size,
            num_workers=args.num_workers,
            device=args.device,
            spice=args.spice,
            grounding=args.grounding,
            metrics_path=args.out,
            results_path=args.results,
            checkpoint=" + ".join(paths),
            clip_model=args.clip_model,
            clip_weights=args.clip_weights,
            instances=instances,
            per_image_path=args.per_image,
            faithfulness=args.faithfulness,
            faithfulness_images=args.faithfulness_images,
        )
        print(json.dumps(shown_scores(report["scores"]), indent=2))
        if attention_summary(report):  # held-out pairs (--holdout data), faithfulness areas
            print(json.dumps(attention_summary(report), indent=2))
        if args.server_results:
            path = write_server_results(
                report["predictions"], args.server_results, args.server_subset, args.server_name, args.server_dir
            )
            print(f"wrote {path} (submit it to the {args.server_results} evaluation server)", file=sys.stderr)
        for key, note in report["notes"].items():
            if key.endswith("_error"):  # a metric that could not be computed, and why
                print(f"note: {note}", file=sys.stderr)
        for p in report.get("skipped", []):
            print(f"skipped: {p}", file=sys.stderr)
        return 1 if report.get("skipped") else 0
