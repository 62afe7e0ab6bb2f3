"""Evaluate a checkpoint on a split: decode every image, then coco-caption scores (and object F1).

Unreadable images are skipped, reported by name and counted; the rest are scored.
"""
from __future__ import annotations

import os
import time
from typing import Optional

import torch
from tqdm.auto import tqdm



def evaluate(
    checkpoint: str,
    annotations: str,
    images_root: Optional[str] = None,
    split: str = "test",
    num_beams: int = 3,
    max_new_tokens: Optional[int] = None,
    length_penalty: Optional[float] = None,
    attention_mode: Optional[str] = None,
    batch_size: int = 32,
    num_workers: int = 0,
    device: Optional[str] = None,
    spice: bool = False,
    grounding: bool = False,
    metrics_path: Optional[str] = None,
    results_path: Optional[str] = None,
    progress: bool = True,
    module=None,
) -> dict:
    """Decode ``split`` with the checkpoint and score it. Returns the report written to ``metrics_path``.

    The report holds "scores" (BLEU-1..4, METEOR, ROUGE_L, CIDEr, SPICE when it can run, object F1
    for datasets with object annotations, grounding scores if asked), the decoding settings and
    the images skipped. ``results_path`` gets the COCO results file [{"image_id", "caption"}].
    """
    from captioning.checkpoint import load_module
    from captioning.data.datamodule import CaptionDataModule
    from captioning.io import atomic_write_json
    from captioning.data.shapes import parse_objects
    from captioning.metrics import CocoScorer, object_f1

    if module is None:
        module = load_module(checkpoint)
    dev = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    module = module.eval().to(dev)
    data = CaptionDataModule(annotations, images_root, eval_batch_size=batch_size, num_workers=num_workers,
                             image_size=int(module.hparams.image_size), on_bad_image="skip")
    data.set_vocab(module.vocab)
    records = data.records(split)
    root = data.images_root

    start = time.perf_counter()
    predictions, maps, skipped = {}, {}, []
    for batch in tqdm(data.eval_dataloader(split), desc=f"decoding {split}", unit="batch", disable=not progress):
        skipped += batch["bad_images"]  # unreadable images, named with the reason; the rest go on
        if batch["image_ids"].numel() == 0:
            continue
        out = module.generate(images=batch["images"].to(dev), num_beams=num_beams, max_new_tokens=max_new_tokens,
                              attention_mode=attention_mode, length_penalty=length_penalty)
        for i, image_id in enumerate(batch["image_ids"].tolist()):
            n = int(out.lengths[i])
            predictions[image_id] = module.vocab.decode_text(out.sequences[i, :n].tolist())
            if grounding:
                maps[image_id] = (module.vocab.decode(out.sequences[i, :n].tolist()), out.attention[i, :n].cpu().numpy(),
                                  out.locations[i, :n].cpu().numpy())
    decode_seconds = time.perf_counter() - start

    by_id = {r.image_id: r for r in records}
    references = {i: by_id[i].captions for i in predictions}
    scores: dict = {}
    notes: dict = {}
    if predictions:
        scorer = CocoScorer(metrics=("BLEU", "METEOR", "ROUGE_L", "CIDEr"), spice=spice)
        try:
            raw = scorer(references, predictions)
        finally:
            if hasattr(scorer, "close"):
                scorer.close()
        scores = {k: v for k, v in raw.items() if isinstance(v, float)}
        notes = {k: v for k, v in raw.items() if not isinstance(v, float)}
        if not spice:
            notes.setdefault("SPICE", "not computed (pass --spice; it needs Java and a Stanford CoreNLP download)")
        truth = {i: _objects(by_id[i]) for i in predictions if by_id[i].objects}
        if truth:
            scores["object_f1"] = object_f1({i: parse_objects(predictions[i]) for i in truth}, truth)
        if grounding:
            scores["grounding"] = _grounding(maps, by_id, module.hparams.attention, root)

    report = {
        "checkpoint": os.fspath(checkpoint) if checkpoint else None,
        "annotations": os.fspath(annotations),
        "split": split,
        "num_images": len(predictions),
        "num_beams": num_beams,
        "attention": module.hparams.attention,
        "attention_mode": attention_mode or module.hparams.inference_attention if module.hparams.attention == "hard" else None,
        "decode_seconds": round(decode_seconds, 2),
        "scores": scores,
        "notes": notes,
        "skipped": skipped,
    }
    if metrics_path:
        atomic_write_json(metrics_path, report)
    if results_path:
        atomic_write_json(results_path, [{"image_id": i, "caption": c} for i, c in predictions.items()])
    return report


def _objects(record):
    from captioning.data.shapes import record_objects

    return record_objects(record)


def _grid(L: int) -> tuple[int, int]:
    """(gh, gw) of L locations: a square grid when L is a square, else one row."""
    import math

    side = math.isqrt(L)
    return (side, side) if side * side == L else (1, L)


def _image_size(rec, images_root: Optional[str]) -> Optional[tuple[int, int]]:
    """(W, H) of the original image: from the record, else read from the file's header."""
    if rec.width and rec.height:
        return int(rec.width), int(rec.height)
    if images_root is None:
        return None
    from PIL import Image

    try:
        with Image.open(os.path.join(images_root, rec.path)) as im:
            return im.size
    except OSError:
        return None


def _grounding(maps: dict, by_id: dict, attention_kind: str, images_root: Optional[str] = None) -> dict:
    """Attention grounding over every generated word that names an object of the image.

    ``maps``: image_id -> (words, attention (T, L), locations (T,)) with word t generated while
    attending with attention[t] (EOS steps past the words are ignored). A word names an object
    when it is the shape noun of a full (size, colour, shape) mention that matches one of the
    image's objects; a mention of a triple the image holds twice takes the first object of that
    triple not yet named in the caption, and mentions beyond the image's count name nothing.
    Each such word is scored with the object's bbox (:func:`captioning.metrics.grounding_scores`).

    Returns grounding_scores' dict; for hard attention also "chosen_cell": the same scores of a
    one-hot map at the cell each word actually attended (``locations``).
    """
    import numpy as np

    from captioning.data.shapes import locate_objects
    from captioning.metrics import grounding_scores

    soft, chosen = [], []
    for image_id, (words, attention, locations) in maps.items():
        rec = by_id[image_id]
        if not rec.objects:
            continue
        size = _image_size(rec, images_root)
        if size is None:
            continue
        attention = np.asarray(attention, dtype=np.float64)
        gh, gw = _grid(attention.shape[-1])  # (T, L) -> maps of (gh, gw)
        unused: dict = {}  # triple -> the image's objects of that triple not yet named, in order
        for obj in rec.objects:
            triple = tuple(str(w).lower() for w in obj.get("words") or (obj["size"], obj["color"], obj["shape"]))
            unused.setdefault(triple, []).append(obj)
        for t, triple in locate_objects(words):  # (index of the shape noun, triple)
            if t >= len(attention) or not unused.get(triple):
                continue
            bbox = unused[triple].pop(0)["bbox"]
            soft.append((attention[t].reshape(gh, gw), size, bbox))
            if attention_kind == "hard":
                one_hot = np.zeros(gh * gw)
                one_hot[int(locations[t])] = 1.0
                chosen.append((one_hot.reshape(gh, gw), size, bbox))
    scores = grounding_scores(soft)
    if attention_kind == "hard":
        scores["chosen_cell"] = grounding_scores(chosen)
    return scores
