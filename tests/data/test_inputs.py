"""data/inputs.py: the images of files, nested folders, globs, @lists and shards, listed in order and
read in batches (in order, with workers too); data/captions_out.py: the --out file's checks."""

import io
import json
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from captioning.data.captions_out import CaptionsFile, NameSet, name_key
from captioning.data.inputs import Source, check_items, count_sources, iter_sources, load_batches, model_pixels_of
from captioning.errors import ConfigError, ImageError
from tests.helpers import write_jpeg


def _tree(root: Path) -> list[Path]:
    """Images in nested folders, with names whose sorted order is tricky (a/b.jpg, a/b/c.jpg, a/b0.jpg)."""
    paths = [root / "a" / "b.jpg", root / "a" / "b" / "c.jpg", root / "a" / "b0.jpg", root / "z.png", root / "a.jpg"]
    for i, p in enumerate(paths):
        p.parent.mkdir(parents=True, exist_ok=True)
        write_jpeg(p, seed=i, size=20)
    (root / "a" / "notes.txt").write_text("not an image")
    return paths


def _names(items, problems=None):
    return [s.name for s in iter_sources([str(i) for i in items], problems)]


def test_a_nested_folder_streams_in_sorted_path_order(tmp_path):
    paths = _tree(tmp_path / "photos")
    expected = sorted(str(p) for p in (tmp_path / "photos").rglob("*") if p.suffix in (".jpg", ".png"))
    assert _names([tmp_path / "photos"]) == expected
    assert set(expected) == {str(p) for p in paths}


def test_globs_lists_and_files_keep_the_order_given(tmp_path):
    paths = _tree(tmp_path / "photos")
    listing = tmp_path / "list.txt"
    listing.write_text(f"# my photos\n{paths[3]}\n\n{paths[0]}\n")
    got = _names([paths[4], f"@{listing}", tmp_path / "photos" / "a" / "*.jpg"])
    assert got == [str(paths[4]), str(paths[3]), str(paths[0]), str(paths[0]), str(paths[2])]
    assert count_sources([f"@{listing}"]) == 2


def test_a_list_naming_a_missing_file_reports_it_and_reads_the_rest(tmp_path):
    paths = _tree(tmp_path / "photos")
    listing = tmp_path / "list.txt"
    listing.write_text(f"{paths[0]}\n{tmp_path / 'gone.jpg'}\n{paths[1]}\n")
    [batch] = list(load_batches(iter_sources([f"@{listing}"]), batch_size=8))
    assert [b.name for b in batch] == [str(paths[0]), str(tmp_path / "gone.jpg"), str(paths[1])]
    assert batch[0].error is None and batch[2].error is None and "gone.jpg" in batch[1].error
    with pytest.raises(ConfigError, match="no such list file"):
        check_items([f"@{tmp_path / 'missing.txt'}"])


def test_empty_arguments_are_problems_not_exceptions(tmp_path):
    (tmp_path / "empty").mkdir()
    problems: list = []
    assert _names([tmp_path / "empty", tmp_path / "*.webp"], problems) == []
    assert [p for p, _ in problems] == [str(tmp_path / "empty"), str(tmp_path / "*.webp")]
    assert all("no images found" in reason for _, reason in problems)
    with pytest.raises(ImageError, match="no images found"):
        _names([tmp_path / "empty"])


def _shard(path: Path, images: dict) -> None:
    with tarfile.open(path, "w") as tar:
        for key, data in images.items():
            for name, payload in ((f"{key}.jpg", data), (f"{key}.json", json.dumps({"caption": "x"}).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))


def _jpeg_bytes(color) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (30, 20), color).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_shards_stream_their_image_members_by_offset(tmp_path):
    _shard(tmp_path / "s-000.tar", {"k0": _jpeg_bytes("red"), "k1": b"not a jpeg"})
    _shard(tmp_path / "s-001.tar", {"k2": _jpeg_bytes("blue")})
    sources = list(iter_sources([str(tmp_path / "s-{000..001}.tar")]))
    assert [s.name for s in sources] == [
        f"{tmp_path / 's-000.tar'}:k0.jpg",
        f"{tmp_path / 's-000.tar'}:k1.jpg",
        f"{tmp_path / 's-001.tar'}:k2.jpg",
    ]
    [batch] = list(load_batches(sources, batch_size=3))
    assert batch[0].image.getpixel((5, 5))[0] > 200 and batch[2].image.getpixel((5, 5))[2] > 200
    assert batch[1].image is None and "k1.jpg" in batch[1].error


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_come_in_input_order_with_workers(tmp_path, workers):
    paths = []
    for i in range(23):
        paths.append(tmp_path / f"{i:03d}.jpg")
        write_jpeg(paths[-1], seed=i, size=16 + i)  # sizes differ: the order is checked by content
    (tmp_path / "013.jpg").write_bytes(b"broken")
    prepare = model_pixels_of([(8, "bilinear")])
    batches = list(load_batches(iter_sources([str(tmp_path)]), prepare, batch_size=5, num_workers=workers))
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
    items = [item for b in batches for item in b]
    assert [i.name for i in items] == [str(p) for p in paths]
    assert [i.error is not None for i in items] == [i == 13 for i in range(23)]
    assert all(i.image[0].shape == (3, 8, 8) for i in items if i.error is None)


@pytest.mark.parametrize("settings", [dict(batch_size=0), dict(num_workers=-1), dict(batch_size=True)])
def test_bad_loader_settings_are_one_line(settings):
    with pytest.raises(ConfigError, match="batch_size|num_workers"):
        next(load_batches([Source("x.jpg")], **settings))


# ------------------------------------------------------------------------------------------ --out
def test_out_file_appends_whole_lines_and_lists_names_on_resume(tmp_path):
    path = tmp_path / "captions.jsonl"
    out = CaptionsFile(path)
    assert len(out.check()) == 0 and not path.exists()
    out.append([{"image": "a.jpg", "generated_text": "a cat", "score": -1.0}, {"image": "b.jpg", "error": "bad"}])
    out.close()
    with open(path, "ab") as f:
        f.write(b'{"image": "c.jpg", "generated')  # a line cut by a crash in its write
    done = CaptionsFile(path).check()
    assert "a.jpg" in done and "b.jpg" in done and "c.jpg" not in done and len(done) == 2
    assert path.read_text().endswith("}\n") and len(path.read_text().splitlines()) == 2


def test_csv_out_has_a_header_and_resumes(tmp_path):
    path = tmp_path / "captions.csv"
    with CaptionsFile(path) as out:
        out.check()
        out.append([{"image": "a, b.jpg", "generated_text": 'a "cat"', "score": -1.5}])
        out.append([{"image": "c.jpg", "error": "unreadable"}])
    assert path.read_text().splitlines()[0] == "image,generated_text,score,error"
    done = CaptionsFile(path).check()
    assert "a, b.jpg" in done and "c.jpg" in done and len(done) == 2


@pytest.mark.parametrize(
    "name,content,expected",
    [
        ("notes.jsonl", "my notes\n", "line 1 is not JSON"),
        ("other.jsonl", '{"image": "a.jpg", "generated_text": "x"}\n[1, 2]\n', "line 2 is not an object"),
        ("results.json", '[{"image_id": 1, "caption": "x"}]\n', "line 1 is not an object"),
        ("table.csv", "a,b\n1,2\n", "not the header"),
        ("binary.jsonl", b"\xff\xfe\x00\n", "not UTF-8"),
    ],
)
def test_an_out_file_of_something_else_is_refused_and_left_as_it_is(tmp_path, name, content, expected):
    path = tmp_path / name
    data = content if isinstance(content, bytes) else content.encode()
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=expected) as err:
        CaptionsFile(path).check()
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert path.read_bytes() == data


def test_out_folder_or_missing_parent_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        CaptionsFile(tmp_path).check()
    with pytest.raises(ConfigError, match="no such folder"):
        CaptionsFile(tmp_path / "nowhere" / "x.jsonl").check()


def test_name_set_holds_hashes():
    names = NameSet(name_key(n) for n in "abca")
    assert "a" in names and "c" in names and "d" not in names and len(names) == 3
    assert "a" not in NameSet()
