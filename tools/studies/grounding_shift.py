"""Grounding of a checkpoint's maps at the shape nouns (as ``evaluate --grounding``) and at the word
before each noun (the noun's colour in the shapes captions), for each layer and the layers' mean.

    python -m tools.studies.grounding_shift CKPT --data DATA/dataset_shapes.json [--beams 3]

The test split; attention correctness (the map's mass inside the named object's box) and the
pointing game (its maximum inside the box). docs/TRAINING.md reads a conv decoder with it: its
maps find the object at the size and colour words and leave it at the noun.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from captioning.api import Captioner
from captioning.data.formats import load_records
from captioning.data.shapes import grounding
from captioning.models.transformer import choose_attention_layer, transformer_members


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", required=True, help="a shapes dataset_shapes.json")
    p.add_argument("--beams", type=int, default=3)
    args = p.parse_args(argv)
    records = {r.image_id: r for r in load_records(args.data) if r.split == "test"}
    root = Path(args.data).parent
    captioner = Captioner.from_checkpoint(args.checkpoint, device="cpu")
    layered = transformer_members(captioner.model)
    layers = ("mean", *range(captioner.model.decoder.num_layers)) if layered else (None,)
    print("layer  noun: correctness pointing  word before: correctness pointing  nouns")
    for layer in layers:
        choose_attention_layer(captioner.model, layer)
        a, b = shift(captioner, records, root, args.beams)
        shown = [fmt(s[k]) for s in (a, b) for k in ("attention_correctness", "pointing_game")]
        print(
            f"{str(layer if layer is not None else '-'):6} {shown[0]} {shown[1]}  {shown[2]} {shown[3]}  {a['count']}"
        )


def shift(captioner, records: dict, root: Path, beams: int) -> tuple[dict, dict]:
    """(grounding at the nouns, grounding at the word before each noun) of ``captioner``'s maps on
    ``records`` (image_id -> ImageRecord, images under ``root``): :func:`grounding`'s dicts."""
    outs = captioner([str(root / r.path) for r in records.values()], return_attention=True, num_beams=beams)
    at_noun, before = lagged(records, outs, root, (0, 1))
    return at_noun, before


def lagged(records: dict, outputs, root, lags=(0, 1, 2)) -> list[dict]:
    """:func:`grounding` of the captions ``outputs`` (the captioner's, with ``return_attention``, in
    the order of ``records``) for each lag: each noun scored with the map of the word ``lag`` before
    it (a uniform map before the first word)."""
    scores = []
    for lag in lags:
        alignments = {}
        for image_id, out in zip(records, outputs):
            maps = np.asarray(out["attention"]).reshape(len(out["attention"]), -1)  # (T, L)
            uniform = np.full((lag, maps.shape[1]), 1.0 / maps.shape[1])
            alignments[image_id] = (list(out["tokens"]), np.concatenate([uniform, maps])[: len(maps)], None)
        scores.append(grounding(records, alignments, str(root)))
    return scores


def fmt(value: float | None) -> str:
    """A score to 3 decimals; "-" when no word named an object (no score)."""
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
