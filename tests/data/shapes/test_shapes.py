"""Tests of the synthetic shapes dataset generator (captioning/data/shapes/__init__.py)."""

import json
from collections import Counter
from itertools import combinations
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from captioning.data import shapes
from captioning.errors import ConfigError

SPATIAL_WORDS = {"left", "right", "above", "below", "top", "bottom", "next", "centre"}


def _make(out_dir, seed=0, n=(40, 10, 10), image_size=64):
    return shapes.generate(
        out_dir, n_train=n[0], n_val=n[1], n_test=n[2], seed=seed, image_size=image_size, progress=False
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    path = _make(root)
    return root, json.loads(path.read_text())


def _image_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.png"))}


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a, b, c = (_make(tmp_path / name, seed=seed, n=(12, 4, 4)) for name, seed in (("a", 3), ("b", 3), ("c", 4)))
    assert a.read_bytes() == b.read_bytes()
    assert _image_bytes(tmp_path / "a") == _image_bytes(tmp_path / "b")
    assert a.read_bytes() != c.read_bytes()
    assert _image_bytes(tmp_path / "a") != _image_bytes(tmp_path / "c")
    assert not list(tmp_path.rglob("*.tmp"))  # the atomic write left nothing behind


def test_karpathy_fields_and_files(dataset):
    root, data = dataset
    assert data["dataset"] == "shapes"
    assert Counter(im["split"] for im in data["images"]) == {"train": 40, "val": 10, "test": 10}
    assert [im["imgid"] for im in data["images"]] == list(range(60))
    sentids = [s["sentid"] for im in data["images"] for s in im["sentences"]]
    assert len(set(sentids)) == len(sentids)
    for im in data["images"]:
        assert im["filepath"] == f"images/{im['split']}"
        with Image.open(root / im["filepath"] / im["filename"]) as img:
            assert img.size == (im["width"], im["height"]) == (64, 64) and img.mode == "RGB"
        assert len(im["sentences"]) == 5
        assert im["sentids"] == [s["sentid"] for s in im["sentences"]]
        for s in im["sentences"]:
            assert s["imgid"] == im["imgid"]
            assert s["tokens"] == s["raw"].split() and s["raw"] == s["raw"].lower()
            assert len(s["tokens"]) <= 30


def test_objects_count_boxes_and_colours(dataset):
    root, data = dataset
    for im in data["images"]:
        objects = im["objects"]
        assert 1 <= len(objects) <= 4
        for o in objects:
            x0, y0, x1, y1 = o["bbox"]
            assert 0 <= x0 < x1 <= im["width"] and 0 <= y0 < y1 <= im["height"]
            assert o["words"] == [o["size"], o["color"], o["shape"]]
        for a, b in combinations([o["bbox"] for o in objects], 2):
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
        # the pixels at each box's centre have the object's colour (nearest palette entry)
        pixels = np.asarray(Image.open(root / im["filepath"] / im["filename"]), dtype=float)
        for o in objects:
            cx, cy = (o["bbox"][0] + o["bbox"][2]) // 2, (o["bbox"][1] + o["bbox"][3]) // 2
            mean = pixels[cy - 1 : cy + 2, cx - 1 : cx + 2].reshape(-1, 3).mean(0)
            nearest = min(shapes.COLOURS, key=lambda c: np.sum((mean - shapes._RGB[c]) ** 2))
            assert nearest == o["color"]


def test_sizes_are_clearly_different(dataset):
    _, data = dataset
    side = {
        size: [o["bbox"][2] - o["bbox"][0] for im in data["images"] for o in im["objects"] if o["size"] == size]
        for size in shapes.SIZES
    }
    assert max(side["small"]) * 1.3 < min(side["large"])


def test_vocabulary_is_covered(dataset):
    _, data = dataset
    objects = [o for im in data["images"] for o in im["objects"]]
    assert len(shapes.COLOURS) >= 5 and len(shapes.SHAPES) >= 4 and len(shapes.SIZES) == 2
    assert {o["color"] for o in objects} == set(shapes.COLOURS)
    assert {o["shape"] for o in objects} == set(shapes.SHAPES)
    assert {o["size"] for o in objects} == set(shapes.SIZES)
    assert {len(im["objects"]) for im in data["images"]} == {1, 2, 3, 4}


def test_every_caption_names_every_object(dataset):
    _, data = dataset
    for im in data["images"]:
        truth = Counter(shapes.record_objects(im))
        for s in im["sentences"]:
            assert Counter(shapes.parse_objects(s["tokens"])) == truth, s["raw"]
            assert Counter(shapes.parse_objects(s["raw"])) == truth, s["raw"]


def test_captions_place_objects(dataset):
    _, data = dataset
    for im in data["images"]:
        if len(im["objects"]) >= 2:
            for s in im["sentences"]:
                assert SPATIAL_WORDS & set(s["tokens"]), s["raw"]


def test_canonical_caption_lists_objects_left_to_right(dataset):
    _, data = dataset
    for im in data["images"]:
        if len(im["objects"]) >= 3:
            order = sorted(im["objects"], key=lambda o: (o["bbox"][0] + o["bbox"][2], o["bbox"][1]))
            first = im["sentences"][0]
            assert shapes.parse_objects(first["tokens"]) == [tuple(o["words"]) for o in order]
            assert first["raw"].endswith("from left to right")


def test_parse_objects():
    caption = "A small red circle, a large blue square and a red triangle next to a large cross."
    assert shapes.parse_objects(caption) == [("small", "red", "circle"), ("large", "blue", "square")]
    tokens = ["a", "large", "green", "cross", "above", "a", "small", "purple", "triangle"]
    assert shapes.parse_objects(tokens) == [("large", "green", "cross"), ("small", "purple", "triangle")]
    assert shapes.parse_objects("") == [] and shapes.parse_objects([]) == []


def test_record_objects_accepts_dicts_and_records():
    objects = [
        {"size": "small", "color": "red", "shape": "circle", "bbox": [0, 0, 5, 5], "words": ["small", "red", "circle"]},
        {"size": "large", "color": "blue", "shape": "square", "bbox": [9, 9, 29, 29]},
    ]
    expected = [("small", "red", "circle"), ("large", "blue", "square")]
    assert shapes.record_objects({"objects": objects}) == expected
    assert shapes.record_objects(SimpleNamespace(objects=objects)) == expected
    assert shapes.record_objects(SimpleNamespace(objects=[])) == []


def test_other_image_sizes(tmp_path):
    data = json.loads(_make(tmp_path, n=(6, 2, 2), image_size=128).read_text())
    for im in data["images"]:
        assert (im["width"], im["height"]) == (128, 128)
        assert all(o["bbox"][2] <= 128 and o["bbox"][3] <= 128 for o in im["objects"])
    with Image.open(tmp_path / data["images"][0]["filepath"] / data["images"][0]["filename"]) as img:
        assert img.size == (128, 128)


@pytest.mark.parametrize("kwargs", [{"image_size": 16}, {"n_train": -1}, {"n_val": 2.5}])
def test_bad_arguments_raise_config_error(tmp_path, kwargs):
    with pytest.raises(ConfigError):
        shapes.generate(tmp_path, progress=False, **{"n_train": 2, "n_val": 1, "n_test": 1, **kwargs})


def test_loads_with_karpathy_reader(dataset):
    karpathy = pytest.importorskip("captioning.data.formats.karpathy")
    root, _ = dataset
    records = karpathy.load_karpathy(root / "dataset_shapes.json")
    assert len(records) == 60
    assert all(shapes.record_objects(r) and len(r.captions) == 5 for r in records)
