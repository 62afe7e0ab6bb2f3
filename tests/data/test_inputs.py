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
    assert len(out.check()) == 0 and path.read_bytes() == b""  # created and locked, empty
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


# ------------------------------------------------------------------------- --out: ours, whole, locked
#: a child process that runs ``code`` with a deadline (a read that would wait for ever fails the test)
def _child(code: str, *args, timeout: float = 120, limit_bytes: int | None = None):
    import subprocess
    import sys

    prefix = ""
    if limit_bytes is not None:  # an address-space limit: reading without bound fails, not the machine
        prefix = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit_bytes}, {limit_bytes}))\n"
    return subprocess.run(
        [sys.executable, "-c", prefix + code, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "name, data",
    [
        ("results.json", b'{"image_id": 1, "caption": "a cat"}'),  # one line of someone else's, no line end
        ("results.jsonl", b'{"image": "a.jpg", "generated_text": "x"}\n{"other": 1}'),  # ours, then another's
        ("notes.jsonl", b"my notes, no line end"),
        ("nul.jsonl", b'{"image": "a.jpg", "generated_text": "x"}\n{"image": \x00\x00'),
        ("table.csv", b"name,value"),  # not even the start of our header
    ],
)
def test_a_file_whose_last_line_is_cut_is_taken_only_when_ours(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ConfigError, match="not a file written by `captioning caption --out`") as err:
        CaptionsFile(path).check()
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert path.read_bytes() == data  # left as it was, not truncated


@pytest.mark.parametrize("cut", [b'{"ima', b'{"image": "b.jpg", "gener'])
def test_our_own_cut_line_is_removed(tmp_path, cut):
    path = tmp_path / "captions.jsonl"
    whole = b'{"image": "a.jpg", "generated_text": "x", "score": -1.0}\n'
    path.write_bytes(whole + cut)
    assert "a.jpg" in CaptionsFile(path).check()
    assert path.read_bytes() == whole
    path.write_bytes(cut)  # a first write cut: the start of one of ours
    assert len(CaptionsFile(path).check()) == 0 and path.read_bytes() == b""


def test_a_fifo_or_a_device_is_refused_at_once(tmp_path):
    import os

    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    code = """
import sys
from captioning.data.captions_out import CaptionsFile
from captioning.errors import ConfigError
for path in sys.argv[1:]:
    try:
        CaptionsFile(path).check()
        print("taken", path)
    except ConfigError as err:
        print(err)
"""
    done = _child(code, fifo, "/dev/null", "/dev/stdout", timeout=60)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 3, done.stderr
    assert all("not a regular file" in line for line in lines), lines


def test_csv_records_with_line_breaks_resume_and_formulas_are_escaped(tmp_path):
    path = tmp_path / "captions.csv"
    names = ["two\nlines.jpg", "=HYPERLINK(1).jpg", "+1.jpg", "-2.jpg", "@x.jpg", "'quoted.jpg", "plain.jpg"]
    with CaptionsFile(path) as out:
        out.check()
        out.append([{"image": n, "generated_text": "=cmd|' /C calc'!A0", "score": -1.5} for n in names])
    cells = [row for row in __import__("csv").reader(io.StringIO(path.read_text(), newline=""))]
    assert cells[0] == ["image", "generated_text", "score", "error"] and len(cells) == 1 + len(names)
    assert all(not row[0].startswith(("=", "+", "-", "@")) for row in cells[1:])  # a spreadsheet runs none
    assert all(row[1] == "'=cmd|' /C calc'!A0" and row[2] == "-1.5" for row in cells[1:])
    done = CaptionsFile(path).check()  # read back as a stream of records: the file is its own
    assert all(n in done for n in names) and len(done) == len(names)
    with open(path, "ab") as f:
        f.write(b'"cut\nin the middle of a quoted cell')
    assert len(CaptionsFile(path).check()) == len(names)
    assert path.read_text().endswith("\n") and path.read_text().count("cut") == 0


def test_names_that_are_not_utf8_are_written_as_their_bytes_and_resumed(tmp_path):
    import os

    name = os.fsdecode(b"caf\xe9.png")  # a Latin-1 name, as the file system gives it
    for suffix in ("jsonl", "csv"):
        path = tmp_path / f"captions.{suffix}"
        with CaptionsFile(path) as out:
            out.check()
            out.append([{"image": name, "generated_text": "a cat", "score": -1.0}, {"image": "b.png", "error": "x"}])
        assert b"caf\xe9.png" in path.read_bytes()
        done = CaptionsFile(path).check()
        assert name in done and "b.png" in done and len(done) == 2


def test_spellings_of_one_path_are_one_image(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = NameSet(name_key(n) for n in ["dir/a.png", "shards/x.tar:k0.png"])
    for same in ("./dir/a.png", f"{tmp_path}/dir/a.png", "dir//a.png", "dir/sub/../a.png"):
        assert same in done, same
    assert f"{tmp_path}/shards/./x.tar:k0.png" in done and "./shards/x.tar:k0.png" in done
    assert "dir/b.png" not in done and "shards/x.tar:k1.png" not in done


def test_a_second_writer_is_refused_and_the_first_keeps_the_file(tmp_path):
    path = tmp_path / "captions.jsonl"
    first = CaptionsFile(path)
    first.check()
    first.append([{"image": "a.jpg", "generated_text": "x", "score": -1.0}])
    with pytest.raises(ConfigError, match="another `captioning caption` run is writing to it") as err:
        CaptionsFile(path).check()
    assert "\n" not in str(err.value)
    first.append([{"image": "b.jpg", "generated_text": "y", "score": -1.0}])
    first.close()
    assert len(CaptionsFile(path).check()) == 2  # free again once the first run ends


def test_an_unused_new_file_is_not_left_behind(tmp_path):
    path = tmp_path / "captions.jsonl"
    with CaptionsFile(path) as out:
        out.check()  # e.g. the model then fails to load
    assert not path.exists()


# ------------------------------------------------------------------------- listing: deep, many, regular
def test_a_tree_deeper_than_the_recursion_limit_is_walked(tmp_path):
    import os
    import sys

    depth = sys.getrecursionlimit() + 100
    folders = [tmp_path / "d"]
    for _ in range(depth - 1):  # (os.makedirs and shutil.rmtree recurse: made and removed a level at a time)
        folders.append(folders[-1] / "d")
    for folder in folders:
        folder.mkdir()
    write_jpeg(folders[-1] / "deep.jpg", seed=0, size=8)
    write_jpeg(tmp_path / "top.jpg", seed=1, size=8)
    try:
        assert _names([tmp_path]) == [str(folders[-1] / "deep.jpg"), str(tmp_path / "top.jpg")]
    finally:
        os.unlink(folders[-1] / "deep.jpg")
        for folder in reversed(folders):
            folder.rmdir()


def test_problems_are_counted_not_kept_and_long_names_are_cut(tmp_path):
    from captioning.data.inputs import Problems, read_batch

    listing = tmp_path / "list.txt"
    long_name = str(tmp_path / ("x" * 100_000 + ".jpg"))
    listing.write_text("\n".join([long_name] + [str(tmp_path / f"missing{i}.jpg") for i in range(20_000)]) + "\n")
    problems = Problems()
    for batch in load_batches(iter_sources([f"@{listing}"]), batch_size=500):
        problems += [(b.name, b.error) for b in batch if b.error is not None]
        if batch[0].name == long_name:
            assert len(batch[0].error) < 1000 and "x" * 100 in batch[0].error  # its start, its end, its reason
    assert len(problems) == 20_001 and len(problems.kept) == problems.keep < 100
    assert problems.unshown == 20_001 - problems.keep and all(len(r) < 1000 for _, r in problems)
    assert read_batch([Source(long_name)])[0].error.endswith(": no such file")


def test_the_encoded_route_reads_regular_files_of_an_images_size_only(tmp_path):
    """--decode-device: an @list entry naming /dev/zero, a FIFO or a file larger than an image may be
    is not read (its reading route says why in one line); run with an address-space limit of 1 GB."""
    import os

    fifo = tmp_path / "fifo.jpg"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.jpg"
    with open(huge, "wb") as f:
        f.truncate(3 << 30)  # a sparse file of 3 GB: no disk, but a read would take 3 GB
    small = tmp_path / "small.jpg"
    write_jpeg(small, seed=0, size=16)
    code = """
import sys
from captioning.data.inputs import Source, read_batch, source_bytes
print([source_bytes(Source(p)) is None for p in sys.argv[1:]])
print([b.error is not None for b in read_batch([Source(p) for p in sys.argv[1:]], encoded=True)])
"""
    done = _child(code, "/dev/zero", fifo, huge, small, timeout=60, limit_bytes=1 << 30)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["[True, True, True, False]", "[True, True, True, False]"]
