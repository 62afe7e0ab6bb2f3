"""Every reader of JSON is total over valid JSON: whatever value a file holds, the reader gives its
result or one line of the project's own errors (naming the file), never a foreign exception; and
what it gives, later steps can use (ids a 64-bit tensor holds, text UTF-8 can store, objects that
scoring reads). Values include integers past 64 bits, lone surrogates and lists of mixed types."""

import io
import json
import tarfile

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from captioning.data.features.reader import FeatureCache
from captioning.data.formats.coco import load_coco, read_split_file
from captioning.data.formats.folder import load_folder
from captioning.data.formats.karpathy import load_karpathy
from captioning.data.formats.webdataset import read_index
from captioning.data.shapes import record_objects
from captioning.errors import CaptioningError
from captioning.models.spec import ModelSpec
from captioning.vocab import Vocabulary

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

EDGES = st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30, "\ud800", "a\udfffb", "\u00b2"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | EDGES
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=25,
)
KEYS = [
    "images",
    "annotations",
    "sentences",
    "filename",
    "filepath",
    "split",
    "cocoid",
    "imgid",
    "raw",
    "tokens",
    "id",
    "image_id",
    "caption",
    "file_name",
    "image_ids",
    "grid",
    "encoder",
    "decoder",
    "image_size",
    "generation",
    "train",
    "captions",
    "objects",
    "words",
    "size",
    "color",
    "shape",
    "bbox",
    "width",
    "height",
    "image",
]
# values shaped like the real files, with any field of any type
NEAR = st.recursive(
    SCALARS | st.sampled_from(["train", "val", "test", "restval", "a.jpg", "x/../y.jpg"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=6),
    max_leaves=30,
)


# files of the readers' own shapes: each leaf mostly a value the reader takes, else any value (so
# that a file reads far enough for its records to reach the later steps)
def mostly(valid, other=None):
    """``valid`` three times in four, else ``other`` (default: mostly the edge values, else any scalar)."""
    other = other if other is not None else st.integers(0, 3).flatmap(lambda k: SCALARS if k == 0 else EDGES)
    return st.integers(0, 3).flatmap(lambda k: other if k == 0 else valid)


WORD = mostly(st.sampled_from(["a", "red", "small", "circle"]))
TEXT = mostly(st.sampled_from(["a small red circle", "two big squares"]))
ID = mostly(st.integers(0, 50))
SPLIT = mostly(st.sampled_from(["train", "val", "test", "restval"]))
FILE = mostly(st.from_regex(r"[a-c]{1,3}\.jpg", fullmatch=True))
SIZE = mostly(st.integers(1, 64))
OBJECT = mostly(
    st.fixed_dictionaries(
        {"size": WORD, "color": WORD, "shape": WORD},
        optional={"bbox": mostly(st.lists(mostly(st.integers(0, 9)), min_size=4, max_size=4))},
    ),
    st.fixed_dictionaries(
        {},
        optional={"words": st.lists(WORD, max_size=3) | SCALARS, "size": WORD, "bbox": st.lists(SCALARS, max_size=5)},
    )
    | SCALARS,
)
OBJECTS = mostly(st.lists(OBJECT, max_size=3))
TOKENS = mostly(st.lists(WORD, min_size=1, max_size=3))
SENTENCE = st.fixed_dictionaries({"raw": TEXT}, optional={"tokens": TOKENS})
KARPATHY = st.fixed_dictionaries(
    {
        "images": st.lists(
            st.fixed_dictionaries(
                {"filename": FILE, "split": SPLIT, "sentences": st.lists(SENTENCE, min_size=1, max_size=3)},
                optional={"cocoid": ID, "imgid": ID, "objects": OBJECTS, "width": SIZE, "height": SIZE},
            ),
            min_size=1,
            max_size=3,
        )
    }
)
COCO = st.fixed_dictionaries(
    {
        "images": st.lists(
            st.fixed_dictionaries({"id": ID, "file_name": FILE}, optional={"width": SIZE, "height": SIZE}),
            min_size=1,
            max_size=3,
        ),
        "annotations": st.lists(st.fixed_dictionaries({"id": ID, "image_id": ID, "caption": TEXT}), max_size=3),
    }
)
SAMPLE = st.fixed_dictionaries(
    {"captions": mostly(st.lists(TEXT, min_size=1, max_size=2))},
    optional={
        "tokens": mostly(st.lists(TOKENS, min_size=1, max_size=1)),
        "image_id": ID,
        "split": SPLIT,
        "objects": OBJECTS,
        "width": SIZE,
        "height": SIZE,
    },
)
ROW = st.fixed_dictionaries({"image": FILE, "caption": TEXT}, optional={"split": SPLIT})


def total(call, path):
    try:
        call()
    except CaptioningError as err:
        assert "\n" not in str(err), str(err)


def usable(records) -> None:
    """What later steps do with records: batch the ids, write text as UTF-8 JSON (a vocabulary,
    results), score the objects."""
    torch.tensor([r.image_id for r in records], dtype=torch.long)
    json.dumps([[r.path, r.captions, r.tokens, r.objects] for r in records], ensure_ascii=False).encode("utf-8")
    vocab = Vocabulary.build((t for r in records for t in r.tokens), min_freq=1)
    json.dumps(vocab.to_dict(), ensure_ascii=False).encode("utf-8")
    for r in records:
        set(record_objects(r))
        assert all(isinstance(t, str) for tokens in r.tokens for t in tokens)


def read(load):
    """``load()``'s records, checked :func:`usable`."""
    return lambda: usable(load())


@FUZZ
@given(value=mostly(KARPATHY | COCO, JSON | NEAR))
def test_annotation_readers(tmp_path, value):
    path = tmp_path / "captions_val2014.json"
    path.write_text(json.dumps(value))
    total(read(lambda: load_karpathy(path)), path)
    total(read(lambda: load_karpathy(path, problems=[])), path)
    total(read(lambda: load_coco(path)), path)
    total(read(lambda: load_coco(path, problems=[])), path)
    total(lambda: read_split_file(path), path)


@FUZZ
@given(rows=st.lists(mostly(ROW, JSON | NEAR), max_size=4))
def test_json_lines(tmp_path, rows):
    path = tmp_path / "captions.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    total(read(lambda: load_folder(path)), path)
    total(read(lambda: load_folder(path, problems=[])), path)


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = _png()


@FUZZ
@given(value=mostly(SAMPLE, JSON | NEAR), text=st.none() | st.text(max_size=12))
def test_shard_samples(tmp_path, value, text):
    shard = tmp_path / "a.tar"
    members = [("k.png", PNG), ("k.json", json.dumps(value).encode())] + ([("k.txt", text.encode())] if text else [])
    with tarfile.open(shard, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    total(read(lambda: read_index(str(shard)).records), shard)
    total(read(lambda: read_index(str(shard), problems=[]).records), shard)


@FUZZ
@given(captions=mostly(st.lists(TEXT | SENTENCE, min_size=1, max_size=3), JSON | NEAR), ids=ID, splits=SPLIT)
def test_hub_rows(monkeypatch, tmp_path, captions, ids, splits):
    """A Hub dataset's rows of any values arrow can hold, through a column mapping."""
    datasets = pytest.importorskip("datasets", reason="the ecosystem extra")
    from captioning.data.formats import hub

    monkeypatch.setenv("CAPTIONING_IMAGE_CACHE", str(tmp_path / "images"))
    try:
        table = datasets.Dataset.from_dict({"image": [PNG], "text": [captions], "key": [ids], "fold": [splits]})
    except Exception:  # noqa: BLE001 -- a value arrow cannot hold is no dataset
        assume(False)
    monkeypatch.setattr(hub, "open_dataset", lambda path: {"train": table})
    path = "hf://fuzz/rows?image=image&captions=text&id=key&split=fold"
    total(read(lambda: hub.load_hub(path)), path)
    total(read(lambda: hub.load_hub(path, problems=[])), path)


@FUZZ
@given(value=JSON | NEAR)
def test_model_spec(value):
    total(lambda: ModelSpec.from_dict(value), None)
    if isinstance(value, dict):
        total(lambda: ModelSpec.from_dict({"encoder": {}, "decoder": {}, **value}), None)


@FUZZ
@given(value=JSON | NEAR)
def test_feature_cache_index(tmp_path, value):
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    (cache / "part-000-of-001.index.json").write_text(json.dumps(value))
    total(lambda: FeatureCache(cache), cache)
