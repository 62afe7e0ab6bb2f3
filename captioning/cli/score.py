"""``captioning score``: any system's captions (a COCO results file) scored as ``evaluate`` scores a model's.

The results file [{"image_id", "caption"}] may come from any code (ruotianluo's, BLIP, a human
baseline); its captions go through :func:`~captioning.evaluation.split_scores.score_split`, the function
``evaluate`` scores its decoded captions with (every registered metric): coco-caption metrics,
diversity, object F1 and CHAIR where the data has objects, CHAIR with a COCO instances file,
CLIPScore with a CLIP model.
Captions for images the split does not have, and images of the split without a caption, are
reported in one line each and left out; the report says how many images were scored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.evaluate import score_args, shown_scores


def score_results(
    results: str,
    annotations: str | list[str],
    images_root: str | None = None,
    split: str = "test",
    instances: str | dict | None = None,
    spice: bool = False,
    clip_model: str | None = None,
    clip_weights: str | None = None,
    metrics: Sequence[str] | None = None,
    tokenizer: str = "auto",
    metrics_path: str | None = None,
    per_image_path: str | None = None,
    device: str | None = None,
    predictions: dict | None = None,
) -> dict:
    """Score the captions of the results file ``results`` (or ``predictions``, {image id: caption} with
    the ids as a results file names them, named ``results``) on ``split`` of ``annotations``. The ids are
    the dataset's own (COCO's integers; AI Challenger's file names, with or without ".jpg"). Returns the
    report written to ``metrics_path`` (evaluate's keys: "scores", "notes", "num_images"; and
    "split_images", the split's size, "coverage", the lines about captions left out) with "predictions"
    (by the records' image_ids) and the :class:`~captioning.evaluation.split_scores.SplitScores` ("scored") added."""
    from captioning.cli.evaluate import write_per_image
    from captioning.common import default_device
    from captioning.data.captions import CaptionData
    from captioning.evaluation.evaluator import Evaluator
    from captioning.evaluation.results_files import cover_split, dataset_ids, read_results
    from captioning.evaluation.split_scores import score_split, split_images, training_captions
    from captioning.files import atomic_write_json
    from captioning.metrics.chair import read_instances
    from captioning.metrics.clip_score import ClipScoring

    if predictions is None:
        predictions = read_results(results)
    if isinstance(instances, (str, os.PathLike)):
        instances = read_instances(instances)
    data = CaptionData(annotations, images_root)
    references = data.references(split)
    kept, coverage = cover_split(predictions, references, os.fspath(results), split, dataset_ids(data))
    evaluator = Evaluator(
        metrics,
        spice=spice,
        training_captions=training_captions(data),
        tokenizer=tokenizer,
        clip=ClipScoring(clip_model, clip_weights, str(default_device(device))) if clip_model else None,
    )
    try:
        scored = score_split(evaluator, data, split, kept, instances, images=split_images(data, split))
    finally:
        evaluator.close()
    if kept and not spice:
        scored.notes.setdefault("SPICE", "not computed (pass --spice; it needs Java and a Stanford CoreNLP download)")
    report = {
        "results": os.fspath(results),
        "annotations": annotations if isinstance(annotations, list) else os.fspath(annotations),
        "split": split,
        "num_images": len(kept),
        "split_images": len(references),
        "scores": scored.scores,
        "notes": scored.notes,
        "coverage": coverage,
    }
    if metrics_path:
        atomic_write_json(metrics_path, report)
    if per_image_path:
        write_per_image(per_image_path, scored.rows(kept, references))
    return {**report, "predictions": kept, "scored": scored}


@COMMANDS.register("score")
class Score(Command):
    help = "score any system's captions (a COCO results file) as evaluate scores a model's"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "results",
            help='COCO results file: [{"image_id": int, "caption": str}, ...] (AI Challenger: the image\'s file name)',
        )
        p.add_argument("--annotations", required=True, nargs="+", metavar="FILE", help="the split's annotation file(s)")
        p.add_argument("--images-root", default=None, help="folder the image paths are relative to (CLIPScore)")
        p.add_argument("--split", default="test")
        p.add_argument("--spice", action="store_true", help="also try SPICE (needs Java and Stanford CoreNLP)")
        p.add_argument("--clip-model", default=None, metavar="MODEL[/TAG]", help="CLIPScore with this OpenCLIP model")
        p.add_argument(
            "--clip-weights", default=None, metavar="FILE", help="the CLIP model's weights from a local file"
        )
        p.add_argument("--device", default=None, help="CLIP's device (default: CUDA when available)")
        p.add_argument("--out", default=None, help="write the metrics JSON here (evaluate's keys)")
        score_args(p)

    def run(self, args: argparse.Namespace) -> int:
        annotations = args.annotations[0] if len(args.annotations) == 1 else args.annotations
        report = score_results(
            args.results,
            annotations,
            images_root=args.images_root,
            split=args.split,
            instances=args.instances,
            spice=args.spice,
            clip_model=args.clip_model,
            clip_weights=args.clip_weights,
            metrics_path=args.out,
            per_image_path=args.per_image,
            device=args.device,
        )
        for line in report["coverage"]:
            print(line, file=sys.stderr)
        print(
            f"scored {report['num_images']} of the {report['split_images']} images of {args.split!r}", file=sys.stderr
        )
        print(json.dumps(shown_scores(report["scores"]), indent=2))
        for key, note in report["notes"].items():
            if key.endswith("_error"):
                print(f"note: {note}", file=sys.stderr)
        return 0
