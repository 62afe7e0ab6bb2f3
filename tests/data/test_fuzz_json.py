"""Every reader of JSON is total over valid JSON: whatever value a file holds, the reader gives its
result or one line of the project's own errors (naming the file), never a foreign exception."""
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from captioning.data.coco import load_coco, read_split_file
from captioning.data.features import FeatureCache
from captioning.data.karpathy import load_karpathy
from captioning.errors import CaptioningError
from captioning.models.spec import ModelSpec

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=12)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=25)
KEYS = ["images", "annotations", "sentences", "filename", "filepath", "split", "cocoid", "imgid", "raw", "tokens", "id",
        "image_id", "caption", "file_name", "image_ids", "grid", "encoder", "decoder", "image_size", "generation", "train"]
# values shaped like the real files, with any field of any type
NEAR = st.recursive(SCALARS | st.sampled_from(["train", "val", "test", "restval", "a.jpg", "x/../y.jpg"]),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=6),
                    max_leaves=30)


def total(call, path):
    try:
        call()
    except CaptioningError as err:
        assert "\n" not in str(err), str(err)


@FUZZ
@given(value=JSON | NEAR)
def test_annotation_readers(tmp_path, value):
    path = tmp_path / "captions_val2014.json"
    path.write_text(json.dumps(value))
    total(lambda: load_karpathy(path), path)
    total(lambda: load_karpathy(path, problems=[]), path)
    total(lambda: load_coco(path), path)
    total(lambda: load_coco(path, problems=[]), path)
    total(lambda: read_split_file(path), path)


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
