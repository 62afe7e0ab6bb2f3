"""Held-out colour-shape pairs (make-shapes --holdout, data/shapes/holdout.py)."""

import json
import re

import pytest

from captioning.cli.main import main
from captioning.data.records import ImageRecord
from captioning.data.shapes.holdout import read_holdout
from captioning.data.shapes.novel_pairs import novel_pair_scores


def _mentions(text: str, colour: str, shape: str) -> bool:
    return re.search(rf"\b{colour}\s+{shape}\b", text) is not None


def test_holdout_pairs_never_reach_training(tmp_path):
    out = tmp_path / "shapes"
    argv = ["make-shapes", "--out", str(out), "--train", "60", "--val", "8", "--test", "8", "--test-novel", "12"]
    assert main(argv + ["--holdout", "red:circle,blue:square"]) == 0
    data = json.loads((out / "dataset_shapes.json").read_text())
    assert data["holdout"] == ["red:circle", "blue:square"]
    assert read_holdout(str(out / "dataset_shapes.json")) == (("red", "circle"), ("blue", "square"))
    held = {("red", "circle"), ("blue", "square")}
    by_split: dict = {}
    for image in data["images"]:
        by_split[image["split"]] = by_split.get(image["split"], 0) + 1
        pairs = {(o["color"], o["shape"]) for o in image["objects"]}
        text = " ".join(s["raw"] for s in image["sentences"])
        named = any(_mentions(text, c, s) for c, s in held)
        if image["split"] == "test_novel":
            assert pairs & held and named, image["filename"]
        else:  # not in the image, nor in any of its captions
            assert not pairs & held and not named, image["filename"]
        assert (out / image["filepath"] / image["filename"]).is_file()
    assert by_split == {"train": 60, "val": 8, "test": 8, "test_novel": 12}


def test_without_a_holdout_the_data_is_unchanged(tmp_path):
    args = ["--train", "6", "--val", "2", "--test", "2"]
    assert main(["make-shapes", "--out", str(tmp_path / "a"), *args]) == 0
    assert main(["make-shapes", "--out", str(tmp_path / "b"), *args, "--holdout", ""]) == 0
    a, b = ((tmp_path / n / "dataset_shapes.json").read_text() for n in "ab")
    assert a == b and "holdout" not in json.loads(a)


@pytest.mark.parametrize(
    "holdout,expected",
    [
        ("red:star", "--holdout: unknown shape 'star'"),
        ("pink:circle", "--holdout: unknown colour 'pink'"),
        ("red-circle", "is not colour:shape"),
        ("red:circle,red:circle", "given twice"),
    ],
)
def test_bad_holdouts_are_one_line_errors(holdout, expected, tmp_path, capsys):
    code = main(["make-shapes", "--out", str(tmp_path / "x"), "--train", "4", "--holdout", holdout])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not (tmp_path / "x" / "dataset_shapes.json").exists()


def test_a_holdout_that_empties_a_split_is_refused(tmp_path, capsys):
    from captioning.data.shapes import COLOURS, SHAPES, generate
    from captioning.errors import ConfigError

    with pytest.raises(ConfigError, match="the test_novel split would be empty"):
        generate(tmp_path, n_train=4, n_val=2, n_test=2, n_test_novel=0, holdout="red:circle", progress=False)
    every = ",".join(f"{c}:{s}" for c in COLOURS for s in SHAPES)
    with pytest.raises(ConfigError, match="leaves the training split empty"):
        generate(tmp_path, n_train=4, holdout=every, progress=False)


def test_novel_pair_scores_count_substitutions():
    def rec(i, objects):
        objs = [{"size": z, "color": c, "shape": s, "words": [z, c, s]} for z, c, s in objects]
        return ImageRecord(i, i, f"{i}.png", "test_novel", ["x"], [["x"]], objs)

    records = [
        rec(1, [("small", "red", "circle")]),
        rec(2, [("large", "red", "circle"), ("small", "green", "cross")]),
        rec(3, [("small", "red", "circle")]),
        rec(4, [("small", "red", "circle")]),
    ]
    predictions = {
        1: "a small red circle",
        2: "a large blue circle to the left of a small green cross",
        3: "a small red square",
        4: "a large green triangle",
    }
    s = novel_pair_scores(records, predictions, [("red", "circle")])
    assert s["objects"] == 4 and s["recall"] == 0.25
    assert s["substituted_colour"] == {"red circle -> blue": 1}
    assert s["substituted_shape"] == {"red circle -> square": 1}
    assert s["missed"] == 1
