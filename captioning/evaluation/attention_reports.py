"""What ``evaluate`` reports besides the metrics, about attention and composition: faithfulness
curves over a split (decoding/faithfulness.py) and, for shapes data made with ``--holdout``, the
held-out pairs' recall on the ``test_novel`` split (data/shapes/holdout.py)."""

from __future__ import annotations

import itertools

import torch

from captioning.data.records import split_records
from captioning.data.shapes.holdout import NOVEL_SPLIT, read_holdout
from captioning.data.shapes.novel_pairs import novel_pair_scores
from captioning.decoding.faithfulness import FRACTIONS, attention_faithfulness


def _image_batches(data, split: str, device, max_images: int | None = None):
    """The split's readable images, a loader batch at a time on ``device``, up to ``max_images``."""
    seen = 0
    for batch in data.eval_dataloader(split):
        batch.pop("bad_images", None)
        if not batch["image_ids"].numel():
            continue
        if max_images is not None:
            if seen >= max_images:
                return
            keep = min(batch["image_ids"].numel(), max_images - seen)
            batch = {k: v[:keep] if torch.is_tensor(v) else v for k, v in batch.items()}
        seen += batch["image_ids"].numel()
        yield {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def faithfulness_report(
    model, data, split: str, generation, device, max_images: int | None = None, fractions=FRACTIONS, seed: int = 0
) -> dict:
    """:func:`~captioning.decoding.faithfulness.attention_faithfulness` over ``split`` of ``data`` (a
    CaptionData), each image's caption decoded with ``generation``; "images" says how many."""
    batches = list(_image_batches(data, split, device, max_images))
    report = attention_faithfulness(model, batches, generation, fractions, seed=seed)
    report["images"] = sum(int(b["image_ids"].numel()) for b in batches)
    return report


@torch.no_grad()
def novel_pair_report(model, data, annotations: str, generation, device) -> dict | None:
    """Recall of the held-out pairs on the ``test_novel`` split (None if the data has no holdout),
    with "object_f1" of that split and a few of its captions ("examples")."""
    from captioning.data.shapes import shapes_scores

    records = {r.image_id: r for r in split_records(data.all_records(), NOVEL_SPLIT)}
    holdout = read_holdout(annotations) if records else ()  # the file read again only for such data
    if not records or not holdout:
        return None
    predictions = {}
    for batch in _image_batches(data, NOVEL_SPLIT, device):
        out = model.generate(features=model.features(batch), config=generation)
        for image_id, text in zip(batch["image_ids"].tolist(), model.decode_text(out.sequences)):
            predictions[image_id] = text
    scores = novel_pair_scores(list(records.values()), predictions, holdout)
    scores["images"] = len(predictions)
    scores["object_f1"] = shapes_scores(list(records.values()), predictions)["object_f1"]
    scores["examples"] = [
        {"image_id": i, "caption": predictions[i], "objects": [" ".join(o["words"]) for o in records[i].objects]}
        for i in itertools.islice(sorted(predictions), 5)
    ]
    return scores


def attention_reports(
    model, data, annotations: str, split: str, generation, device, faithfulness: bool = False, max_images=None
) -> dict:
    """What ``evaluate`` adds to its report: "novel_pairs" (data made with --holdout) and, asked,
    "faithfulness". An ensemble has neither (its members attend over their own grids)."""
    from captioning.errors import ConfigError

    single = hasattr(model, "decoder") and hasattr(model, "encoder")
    if faithfulness and not single:
        raise ConfigError("--faithfulness: measures one model's attention; give one --checkpoint")
    extra = {}
    novel = novel_pair_report(model, data, annotations, generation, device) if single else None
    if novel is not None:
        extra["novel_pairs"] = novel
    if faithfulness:
        extra["faithfulness"] = faithfulness_report(model, data, split, generation, device, max_images)
    return extra


def attention_summary(report: dict) -> dict:
    """The printed lines of :func:`attention_reports`' parts: recall and substitutions, and the
    faithfulness areas per removal and word class."""
    shown = {}
    novel = report.get("novel_pairs")
    if novel:
        shown["novel_pairs"] = {
            k: novel[k]
            for k in (
                "novel_pairs",
                "images",
                "recall",
                "pair_recall",
                "substituted_colour",
                "substituted_shape",
                "missed",
            )
        }
    faith = report.get("faithfulness")
    if faith:
        shown["faithfulness_areas"] = {
            removal: {name: {k: round(v, 4) for k, v in c["area"].items()} for name, c in classes.items()}
            for removal, classes in faith["removal"].items()
        }
    return shown
