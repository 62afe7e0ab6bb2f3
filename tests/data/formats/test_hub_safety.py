"""Reading a Hub dataset runs no code and reads no file of this machine that the dataset names: the
library is told never to run a loading script (and a release that would run it anyway is refused), an
``hf://`` name is only ever a Hub name, and an image value that holds a path instead of bytes is
read only from inside a save_to_disk folder. Row values no later step can use are one line at
reading. Nothing is downloaded: ``datasets.load_dataset`` is replaced by a fake."""

import io

import pytest
from PIL import Image

from captioning.data.formats import load_records
from captioning.data.formats.hub import load_hub
from captioning.errors import AnnotationError

datasets = pytest.importorskip("datasets", reason="the ecosystem extra: pip install -e '.[ecosystem]'")


@pytest.fixture(autouse=True)
def image_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTIONING_IMAGE_CACHE", str(tmp_path / "image_cache"))


def png(colour=(200, 10, 10)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def image_rows(images, captions=None, plain=False, **columns):
    """A dataset of an image column (an Image feature, or with ``plain`` a struct of bytes and path,
    which save_to_disk stores as it is) and a caption column."""
    n = len(images)
    table = {"image": images, "caption": captions or [["a red square"]] * n, **columns}
    image = {"bytes": datasets.Value("binary"), "path": datasets.Value("string")} if plain else datasets.Image()
    features = {"image": image, "caption": datasets.Sequence(datasets.Value("string"))}
    features.update({k: datasets.Value("string") for k in columns})
    return datasets.Dataset.from_dict(table, features=datasets.Features(features))


class FakeHub:
    """datasets.load_dataset's stand-in: records each call, returns ``parts``."""

    def __init__(self, parts):
        self.parts, self.calls = parts, []

    def __call__(self, name, **kwargs):
        self.calls.append((name, kwargs))
        return datasets.DatasetDict(self.parts)


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub({"train": image_rows([{"bytes": png(), "path": None}])})
    monkeypatch.setattr(datasets, "load_dataset", fake)
    return fake


def one_line(call) -> str:
    with pytest.raises(AnnotationError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_no_loading_script_is_run(hub):
    records = load_records("hf://someone/captions@v1")
    assert len(records) == 1 and records[0].captions == ["a red square"]
    assert hub.calls == [("someone/captions", {"revision": "v1", "trust_remote_code": False})]


@pytest.mark.parametrize("version", ["2.15.0", "2.14.7.dev0", "1.18.3"])
def test_a_datasets_release_that_runs_scripts_anyway_is_refused(hub, monkeypatch, version):
    monkeypatch.setattr(datasets, "__version__", version)
    message = one_line(lambda: load_records("hf://someone/captions"))
    assert f"datasets {version} runs a Hub dataset's loading script" in message and "datasets>=2.20" in message
    assert hub.calls == []


@pytest.mark.parametrize(
    "name", ["..", "../x", "./x", "a/..", "a/../b", ".hidden", "a/.b", "a/b/c", "-x", "a.", "", "/abs"]
)
def test_names_that_are_no_hub_names(hub, name):
    assert "expected hf://owner/name[@revision]" in one_line(lambda: load_records(f"hf://{name}"))
    assert hub.calls == []


@pytest.mark.parametrize("name", ["someone/captions", "captions", "script.py"])
def test_a_local_path_never_shadows_the_hub_name(hub, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".py"):
        (tmp_path / name).write_text("raise SystemExit('a script ran')\n")
    else:
        (tmp_path / name).mkdir()
    message = one_line(lambda: load_records(f"hf://{name}"))
    assert f"{name!r} is also a path in the working folder" in message
    assert hub.calls == []
    monkeypatch.chdir(tmp_path / "image_cache" if (tmp_path / "image_cache").is_dir() else tmp_path.parent)
    load_records(f"hf://{name}")  # elsewhere: the Hub's
    assert [c[0] for c in hub.calls] == [name]


def test_a_hub_dataset_never_makes_us_read_a_local_file(tmp_path, monkeypatch):
    secret = tmp_path / "secret.png"  # an image, so that nothing but its path refuses it
    secret.write_bytes(png((1, 2, 3)))
    fake = FakeHub({"train": image_rows([{"bytes": png(), "path": None}, {"bytes": None, "path": str(secret)}])})
    monkeypatch.setattr(datasets, "load_dataset", fake)
    message = one_line(lambda: load_hub("hf://someone/captions"))
    assert "train[1]: image: holds a file path" in message and "never from this machine's disk" in message
    problems = []
    assert len(load_hub("hf://someone/captions", problems=problems)) == 1 and len(problems) == 1
    cached = [p for p in (tmp_path / "image_cache").rglob("*") if p.is_file()]
    assert all(p.read_bytes() != secret.read_bytes() for p in cached)


def test_a_saved_folder_may_hold_paths_inside_itself_only(tmp_path):
    """A save_to_disk folder (written by an older datasets, or by hand) may name image files: those
    inside it are read, a path out of it is a problem of its row."""
    folder = tmp_path / "saved"
    inside = folder / "images" / "a.png"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(png())
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(png((1, 2, 3)))
    rows = [
        {"bytes": None, "path": str(inside)},
        {"bytes": None, "path": "images/a.png"},
        {"bytes": None, "path": str(outside)},
        {"bytes": None, "path": "../elsewhere.png"},
    ]
    image_rows(rows, plain=True, split=["train"] * 4).save_to_disk(
        str(folder)
    )  # (an Image feature would be saved with its bytes)
    problems = []
    records = load_hub(str(folder), problems=problems)
    assert len(records) == 2, problems
    assert len(problems) == 2 and all("is outside the dataset's folder" in p for p in problems), problems


@pytest.mark.parametrize(
    "column, value, expected",
    [
        ("img_id", "99999999999999999999", "img_id: 99999999999999999999 is outside the 64-bit"),
        ("img_id", "9" * 5000, "is outside the 64-bit"),
    ],
)
def test_ids_that_no_64_bit_tensor_holds(monkeypatch, column, value, expected):
    parts = {"train": image_rows([{"bytes": png(), "path": None}] * 2, **{column: ["3", value]})}
    monkeypatch.setattr(datasets, "load_dataset", FakeHub(parts))
    assert expected in one_line(lambda: load_hub("hf://someone/captions"))


def test_ids_of_other_digits_fall_back_to_the_row(monkeypatch):
    parts = {"train": image_rows([{"bytes": png(), "path": None}] * 2, img_id=["\u00b2", "7"])}  # a superscript two
    monkeypatch.setattr(datasets, "load_dataset", FakeHub(parts))
    assert [r.image_id for r in load_hub("hf://someone/captions")] == [0, 7]


def test_token_lists_of_other_values(monkeypatch, tmp_path):
    rows = datasets.Dataset.from_dict(
        {
            "filename": ["a.jpg", "b.jpg"],
            "split": ["train", "train"],
            "sentences": [[{"raw": None, "tokens": [1, 2]}], [{"raw": None, "tokens": [3]}]],
        }
    )
    monkeypatch.setattr(datasets, "load_dataset", FakeHub({"train": rows}))
    assert "sentences: tokens: expected a list of strings" in one_line(lambda: load_hub("hf://someone/karpathy"))
