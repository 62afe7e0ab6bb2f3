"""Attention grounding of the shapes data (shapes.grounding): which word names which object, and the scores."""

import shutil

import numpy as np
import pytest
from PIL import Image

from captioning.data.records import ImageRecord
from captioning.data.shapes import grounding, locate_objects
from captioning.metrics import grounding_scores
from captioning.viz.pictures import upsample_map


def soft_maps(alignments):
    """The alignments of a soft-attention model: no chosen locations."""
    return {i: (words, alphas, None) for i, (words, alphas, _) in alignments.items()}


W, H, G = 80, 40, 4  # a non-square original image; a 4 x 4 attention grid (cells 20 wide, 10 high)
OBJECTS = [  # two small red circles (a duplicate triple) and a large blue square
    {"size": "small", "color": "red", "shape": "circle", "bbox": [0, 0, 20, 20], "words": ["small", "red", "circle"]},
    {"size": "small", "color": "red", "shape": "circle", "bbox": [40, 20, 60, 40], "words": ["small", "red", "circle"]},
    {
        "size": "large",
        "color": "blue",
        "shape": "square",
        "bbox": [20, 0, 60, 20],
        "words": ["large", "blue", "square"],
    },
]
# mentions: A (noun at 3), a partial one (nothing), B (the second red circle), C, a third red circle (the
# image has only two: nothing), a green cross (not in the image: nothing)
CAPTION = (
    "a small red circle , a red circle , a small red circle and a large blue square "
    "and a small red circle and a small green cross"
).split()
NOUNS = {3: [0, 0, 20, 20], 12: [40, 20, 60, 40], 17: [20, 0, 60, 20]}  # word index -> the bbox it names
CHOSEN = {3: (0, 0), 12: (3, 2), 17: (3, 3)}  # cells for one-hot maps: in A, in B, outside C


def _record(objects=OBJECTS, width=W, height=H, path="x.png"):
    return ImageRecord(0, 7, path, "test", ["c"], [["c"]], objects, width, height)


def _one_hot(row, col):
    grid = np.zeros((G, G))
    grid[row, col] = 1.0
    return grid


def _maps(noun_map):
    """(T, L) attention: ``noun_map(t)`` at the nouns, a one-hot at the bottom-right cell elsewhere (plus EOS)."""
    T = len(CAPTION) + 1
    attention = np.tile(_one_hot(G - 1, G - 1).reshape(1, -1), (T, 1))
    for t in NOUNS:
        attention[t] = noun_map(t).reshape(-1)
    locations = np.full(T, G * G - 1)
    for t, (r, c) in CHOSEN.items():
        locations[t] = r * G + c
    return attention, locations


def test_mentions_are_full_triples_with_the_noun_position():
    assert locate_objects(CAPTION) == [
        (3, ("small", "red", "circle")),
        (12, ("small", "red", "circle")),
        (17, ("large", "blue", "square")),
        (22, ("small", "red", "circle")),
        (27, ("small", "green", "cross")),
    ]
    assert locate_objects("a red circle".split()) == []
    assert locate_objects(["Small", "RED", "circle"]) == [(2, ("small", "red", "circle"))]


def test_uniform_maps_score_the_box_area_fraction_by_hand():
    attention, locations = _maps(lambda t: np.full((G, G), 1.0 / (G * G)))
    got = grounding({7: _record()}, soft_maps({7: (CAPTION, attention, locations)}))
    # A: 400 / 3200 of the image and holds the top-left pixel (a flat map's argmax); B: 400 / 3200; C: 800 / 3200
    shares, hits = [0.125, 0.125, 0.25], [1.0, 0.0, 0.0]
    assert got["count"] == 3 and "chosen_cell" not in got
    assert got["attention_correctness"] == pytest.approx(np.mean(shares)) == pytest.approx(1 / 6)
    assert got["pointing_game"] == pytest.approx(np.mean(hits))
    assert got["uniform"]["attention_correctness"] == pytest.approx(1 / 6)
    assert got["uniform"]["pointing_game"] == pytest.approx(1 / 6)
    # the centre prior points at the image centre (40, 20): B's top-left corner (B holds it), C's exclusive
    # bottom edge (C does not)
    assert got["center_prior"]["pointing_game"] == pytest.approx(1 / 3)
    assert set(got) == {"attention_correctness", "pointing_game", "count", "uniform", "center_prior"}


def _mass(grid, bbox):
    """The share of the upsampled, normalised map inside ``bbox`` (pixel centres), computed directly."""
    up = upsample_map(grid, (W, H))
    up = up / up.sum()
    x0, y0, x1, y1 = bbox
    return up[y0:y1, x0:x1].sum()  # integer boxes: the pixels whose centres are inside


def test_one_hot_maps_in_and_out_of_the_named_boxes():
    attention, locations = _maps(lambda t: _one_hot(*CHOSEN[t]))
    got = grounding({7: _record()}, soft_maps({7: (CAPTION, attention, locations)}))
    expected = [_mass(_one_hot(*CHOSEN[t]), NOUNS[t]) for t in sorted(NOUNS)]
    assert expected[0] > 0.5 and expected[1] > 0.5 and expected[2] < 0.05
    assert got["count"] == 3
    assert got["attention_correctness"] == pytest.approx(np.mean(expected))
    assert got["pointing_game"] == pytest.approx(2 / 3)  # A and B hit, C missed


def test_hard_models_also_score_the_chosen_cell():
    attention, locations = _maps(lambda t: np.full((G, G), 1.0 / (G * G)))
    got = grounding({7: _record()}, {7: (CAPTION, attention, locations)})
    assert got["attention_correctness"] == pytest.approx(1 / 6) and got["pointing_game"] == pytest.approx(1 / 3)
    chosen = got["chosen_cell"]
    assert chosen == grounding_scores([(_one_hot(*CHOSEN[t]), (W, H), NOUNS[t]) for t in sorted(NOUNS)])
    assert chosen["count"] == 3 and chosen["pointing_game"] == pytest.approx(2 / 3)
    assert chosen["attention_correctness"] == pytest.approx(
        np.mean([_mass(_one_hot(*CHOSEN[t]), NOUNS[t]) for t in sorted(NOUNS)])
    )


def test_objects_are_matched_per_image_and_sizes_read_from_files(tmp_path):
    Image.new("RGB", (W, H)).save(tmp_path / "x.png")
    attention, locations = _maps(lambda t: np.full((G, G), 1.0 / (G * G)))
    records = {7: _record(width=None, height=None), 8: _record(objects=[]), 9: _record(objects=OBJECTS[2:])}
    maps = {i: (CAPTION, attention, locations) for i in records}
    got = grounding(records, soft_maps(maps), images_root=str(tmp_path))
    # image 7 as before (size from the file); image 8 has no objects; image 9 only the square (C)
    assert got["count"] == 4
    assert got["attention_correctness"] == pytest.approx((0.125 + 0.125 + 0.25 + 0.25) / 4)
    # nothing to score: None means, count 0
    empty = grounding({8: _record(objects=[])}, {8: (CAPTION, attention, locations)})
    assert empty["count"] == 0 and empty["attention_correctness"] is None and empty["chosen_cell"]["count"] == 0


@pytest.mark.skipif(shutil.which("java") is None, reason="pycocoevalcap's tokenizer needs Java")
def test_evaluate_reports_grounding(tiny_checkpoint, tiny_shapes):
    from captioning.cli.evaluate import evaluate
    from captioning.decoding.search import GenerationConfig
    from captioning.storage.load import load_model

    report = evaluate(
        load_model(tiny_checkpoint),
        str(tiny_shapes),
        split="test",
        generation=GenerationConfig(max_new_tokens=12),
        grounding=True,
        device="cpu",
        progress=False,
    )
    g = report["scores"]["grounding"]
    assert {"attention_correctness", "pointing_game", "count", "uniform", "center_prior"} <= set(g)
    assert "chosen_cell" not in g  # a soft-attention checkpoint
