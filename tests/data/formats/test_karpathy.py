import json

import pytest

from captioning.data.formats.karpathy import load_karpathy
from captioning.data.records import ImageRecord, split_records
from captioning.errors import AnnotationError, ConfigError

CIRCLE = {"size": "small", "color": "red", "shape": "circle", "bbox": [1, 2, 10, 12.5]}


def karpathy_image(imgid, split="train", filepath="imgs", sentences=None, **extra):
    sentences = sentences if sentences is not None else [{"tokens": ["a", "dog"], "raw": "A dog."}]
    return {
        "filepath": filepath,
        "filename": f"{imgid}.jpg",
        "imgid": imgid,
        "split": split,
        "sentences": sentences,
        **extra,
    }


def write_karpathy(tmp_path, images, name="ann.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"dataset": "test", "images": images}, ensure_ascii=False), encoding="utf-8")
    return path


def annotation_error(path, **kwargs):
    with pytest.raises(AnnotationError) as info:
        load_karpathy(path, **kwargs)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message[len(str(path)) + 2 :]


def test_loads_records(tmp_path):
    images = [
        karpathy_image(
            0,
            cocoid=391895,
            width=640,
            height=480,
            sentences=[
                {"tokens": ["A", "Man", "riding"], "raw": "A man riding."},
                {"raw": "Un homme à vélo, près du café."},
                {"tokens": [], "raw": "   "},
            ],
        ),
        karpathy_image(1, split="val", filepath="", objects=[CIRCLE]),
        karpathy_image(2, split="restval"),
        karpathy_image(3, split="test", sentences=[{"tokens": ["two", "cats"]}]),
    ]
    records = load_karpathy(write_karpathy(tmp_path, images))
    assert all(isinstance(r, ImageRecord) for r in records)
    first = records[0]
    assert (first.imgid, first.image_id, first.path, first.split) == (0, 391895, "imgs/0.jpg", "train")
    assert first.captions == ["A man riding.", "Un homme à vélo, près du café."]  # the blank one is skipped
    assert first.tokens == [["a", "man", "riding"], ["un", "homme", "à", "vélo", "près", "du", "café"]]
    assert (first.width, first.height, first.objects) == (640, 480, [])
    assert records[1].path == "1.jpg" and records[1].image_id == 1 and records[1].objects == [CIRCLE]
    assert records[2].split == "train"  # restval merged
    assert records[3].captions == ["two cats"]  # no raw: the tokens joined
    assert [r.imgid for r in split_records(records, "train")] == [0, 2]
    assert load_karpathy(write_karpathy(tmp_path, images), merge_restval=False)[2].split == "restval"
    with pytest.raises(ConfigError):
        split_records(records, "dev")


def test_file_level_errors(tmp_path):
    assert annotation_error(tmp_path / "none.json") == "no such file"
    assert "directory" in annotation_error(tmp_path)
    (tmp_path / "bad.json").write_text('{"images": [\n  {"filename": "a.jpg",,}\n]}')
    assert annotation_error(tmp_path / "bad.json").startswith(
        "malformed JSON at line 2, column 24: Expecting property name"
    )
    (tmp_path / "list.json").write_text("[]")
    assert "missing top-level field 'images'" in annotation_error(tmp_path / "list.json")
    (tmp_path / "noimages.json").write_text('{"annotations": []}')
    assert "missing top-level field 'images'" in annotation_error(tmp_path / "noimages.json")
    (tmp_path / "latin1.json").write_bytes('{"images": ["café"]}'.encode("latin-1"))
    assert "not UTF-8" in annotation_error(tmp_path / "latin1.json")


@pytest.mark.parametrize("field", ["filename", "split", "sentences"])
def test_missing_image_fields(tmp_path, field):
    images = [karpathy_image(0), karpathy_image(1), karpathy_image(2), karpathy_image(3)]
    del images[3][field]
    assert annotation_error(write_karpathy(tmp_path, images)) == f"images[3]: missing field '{field}'"


def test_field_errors(tmp_path):
    def error_for(image):
        return annotation_error(write_karpathy(tmp_path, [karpathy_image(0), image]))

    assert error_for(karpathy_image(1, sentences=[{"tokens": ["a"]}, {"sentid": 4}])) == (
        "images[1].sentences[1]: missing field 'tokens' or 'raw'"
    )
    assert error_for(karpathy_image(1, split="dev")) == (
        "images[1].split: unknown split 'dev' (expected one of train, val, test, restval, test_novel)"
    )
    assert error_for(karpathy_image(1, sentences="a dog")).startswith("images[1].sentences: expected a list")
    assert error_for(karpathy_image(1, sentences=[{"tokens": "a dog"}])).startswith("images[1].sentences[0].tokens")
    assert error_for({**karpathy_image(1), "imgid": "1"}).startswith("images[1].imgid: expected an integer")
    assert error_for("1.jpg").startswith("images[1]: expected an object")


@pytest.mark.parametrize("split", ["train", "test"])
def test_image_without_usable_captions(tmp_path, split):
    blank = karpathy_image(1, split=split, sentences=[{"raw": " \t"}, {"tokens": [" "], "raw": "..."}])
    message = annotation_error(write_karpathy(tmp_path, [karpathy_image(0), blank]))
    assert message == "images[1] (imgs/1.jpg): no usable captions (all missing or empty)"


def test_duplicates(tmp_path):
    twice = [karpathy_image(0), karpathy_image(1), karpathy_image(1, filepath="other")]
    assert annotation_error(write_karpathy(tmp_path, twice)) == (
        "images[2]: image listed twice (imgid 1 already used by images[1])"
    )
    same_file = [karpathy_image(0), karpathy_image(1), {**karpathy_image(5), "filename": "1.jpg"}]
    assert annotation_error(write_karpathy(tmp_path, same_file)) == (
        "images[2]: image listed twice (path 'imgs/1.jpg' already used by images[1])"
    )
    same_coco = [karpathy_image(0, cocoid=9), karpathy_image(1, cocoid=9)]
    assert "image_id 9 already used by images[0]" in annotation_error(write_karpathy(tmp_path, same_coco))


def test_ids_that_no_64_bit_tensor_holds(tmp_path):
    """An id of valid JSON past int64 is refused at reading (before, it failed in the collate's
    torch.tensor, after the whole split was read); the extremes that fit are read and batched."""
    import torch

    for bad in (2**63, -(2**63) - 1, 10**30):
        message = annotation_error(write_karpathy(tmp_path, [karpathy_image(0), {**karpathy_image(1), "cocoid": bad}]))
        assert message.startswith("images[1].cocoid: ") and "64-bit" in message
    assert annotation_error(write_karpathy(tmp_path, [{**karpathy_image(0), "imgid": 2**64}])).startswith(
        "images[0].imgid"
    )
    edges = [{**karpathy_image(0), "cocoid": 2**63 - 1}, {**karpathy_image(1), "cocoid": -(2**63)}]
    ids = [r.image_id for r in load_karpathy(write_karpathy(tmp_path, edges))]
    assert torch.tensor(ids).tolist() == [2**63 - 1, -(2**63)]
    (tmp_path / "digits.json").write_text('{"images": [{"imgid": ' + "9" * 5000 + "}]}")
    assert "unreadable JSON" in annotation_error(tmp_path / "digits.json")  # Python's own digit limit


def test_lone_surrogates_are_refused_at_reading(tmp_path):
    """JSON's escapes can spell a lone surrogate, which no UTF-8 file (a vocabulary, results) can hold."""
    path = tmp_path / "ann.json"
    for sentence, field in (({"tokens": ["a", "\ud800"]}, "tokens"), ({"raw": "a dog \udfff"}, "raw")):
        path.write_text(json.dumps({"images": [karpathy_image(0), karpathy_image(1, sentences=[sentence])]}))
        message = annotation_error(path)
        assert message.startswith(f"images[1].sentences[0].{field}: a lone surrogate")
        problems = []
        assert [r.imgid for r in load_karpathy(path, problems=problems)] == [0] and len(problems) == 1


@pytest.mark.parametrize(
    "objects, field",
    [
        ([{"shape": "circle"}], "objects[0]"),  # no size: scoring would fail with a KeyError
        ([{"size": "small", "color": "red", "shape": 3}], "objects[0]"),
        ([{"words": "small red circle"}], "objects[0].words"),
        ([{"words": ["small", 1, "circle"]}], "objects[0].words"),
        ([{**CIRCLE, "bbox": [0, 0, 1]}], "objects[0].bbox"),
        ([{**CIRCLE, "bbox": [0, 0, 1, "2"]}], "objects[0].bbox"),
        ([CIRCLE, "circle"], "objects[1]"),
        ({"shape": "circle"}, "objects"),
    ],
)
def test_objects_that_scoring_cannot_use(tmp_path, objects, field):
    message = annotation_error(write_karpathy(tmp_path, [karpathy_image(0), karpathy_image(1, objects=objects)]))
    assert message.startswith(f"images[1].{field}: ")


def test_objects_that_are_read_are_scored(tmp_path):
    from captioning.data.shapes import record_objects, shapes_scores

    words = {"words": ["big", "blue", "square"], "bbox": [0, 0, 4, 4]}
    records = load_karpathy(
        write_karpathy(
            tmp_path,
            [karpathy_image(0, objects=[CIRCLE, words]), karpathy_image(1, objects=[{**CIRCLE, "bbox": None}])],
        )
    )
    assert record_objects(records[0]) == [("small", "red", "circle"), ("big", "blue", "square")]
    scores = shapes_scores(records, {0: "a small red circle", 1: "a small red circle"})
    assert scores["object_precision"] == 1.0
    words_and_maps = (["a", "small", "red", "circle"], [[0.25] * 4] * 4, None)  # (T,), (T, L) with L = 2 x 2
    scores = shapes_scores(
        records,
        {0: "a small red circle", 1: "a small red circle"},
        {0: words_and_maps, 1: words_and_maps},
        str(tmp_path),
    )
    assert "grounding" in scores  # image 1's circle has no box: not scored, no KeyError


@pytest.mark.parametrize(
    "size, field",
    [
        ({"width": 0}, "width"),
        ({"height": -3}, "height"),
        ({"width": 1.5}, "width"),
        ({"width": 10**6, "height": 10**6}, None),
    ],
)
def test_image_sizes_that_make_no_sense(tmp_path, size, field):
    message = annotation_error(write_karpathy(tmp_path, [karpathy_image(0, **size)]))
    assert message.startswith(f"images[0].{field}: " if field else "images[0]: 1000000 x 1000000 pixels")


# ---------------------------------------------------------------- the images read one at a time
IMAGES = [
    karpathy_image(0, sentences=[{"tokens": ["A", " Dog ", "", "  "], "raw": "  A dog.  "}, {"raw": "Two cats"}]),
    karpathy_image(1, split="val", sentences=[{"tokens": ["un", "caf\u00e9"], "raw": "Un caf\u00e9"}]),
    karpathy_image(2, split="restval", sentences=[{"tokens": ["x"], "raw": ""}, {"tokens": ["  "], "raw": "a"}]),
]


def whole_file(path, **kwargs):
    """The records as read from the whole file's parse (what the streamed reading must equal)."""
    from captioning.data.formats.base import read_json
    from captioning.data.formats.karpathy import _records

    return _records(
        str(path), read_json(str(path))["images"], kwargs.get("merge_restval", True), kwargs.get("problems")
    )


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"images": IMAGES}),
        json.dumps({"dataset": "coco", "images": IMAGES, "more": [1, {"images": 2}]}, indent=2),
        "\ufeff" + json.dumps({"images": IMAGES}) + "\n\n",
        json.dumps({"images": []}),
        json.dumps({"images": [IMAGES[0]], "x": 1}).replace("[", " [ \n").replace(",", " ,\t"),
        '{"images": [], "images": ' + json.dumps(IMAGES) + "}",  # JSON keeps the last
    ],
)
def test_streamed_images_read_as_the_whole_file(tmp_path, text):
    path = tmp_path / "ann.json"
    path.write_text(text, encoding="utf-8")
    records = load_karpathy(path)
    assert records == whole_file(path)
    assert len(records) == len(json.loads(text.lstrip("\ufeff"))["images"])


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"images": IMAGES}) + " x",
        json.dumps({"images": IMAGES})[:-30],
        json.dumps({"images": IMAGES}).replace("}]", "},]"),
        json.dumps([{"images": IMAGES}]),
        json.dumps({"dataset": "coco"}),
        json.dumps({"images": {"a": 1}}),
        "",
    ],
)
def test_streamed_reading_fails_as_the_whole_file(tmp_path, text):
    path = tmp_path / "ann.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(AnnotationError) as streamed:
        load_karpathy(path)
    try:
        whole = json.loads(text)
        expected = (
            "missing top-level field 'images'"
            if not isinstance(whole, dict) or "images" not in whole
            else "expected a list"
        )
        assert expected in str(streamed.value)
    except json.JSONDecodeError as err:
        assert str(streamed.value) == f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}"


def test_streamed_problems_are_the_whole_files(tmp_path):
    images = IMAGES + [karpathy_image(0), karpathy_image(5, sentences=[{"tokens": [3]}]), {"filename": "x"}]
    path = write_karpathy(tmp_path, images)
    problems, expected = [], []
    assert load_karpathy(path, problems=problems) == whole_file(path, problems=expected)
    assert problems == expected and len(problems) == 3
