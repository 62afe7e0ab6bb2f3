import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from captioning.errors import CheckpointError
from captioning.files import atomic_write_bytes, atomic_write_json, atomic_write_text, safe_torch_load


class NotWeights:  # unpickling it would import and build an arbitrary class
    pass


def leftovers(folder):
    return [p for p in os.listdir(folder) if p.endswith(".tmp")]


def test_atomic_writes_round_trip_and_create_parent_folders(tmp_path):
    atomic_write_bytes(tmp_path / "a" / "b.bin", b"\x00\x01")
    atomic_write_text(tmp_path / "t.txt", "héllo")
    atomic_write_json(tmp_path / "j.json", {"caption": "un café", "n": [1, 2]})
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
    assert json.loads((tmp_path / "j.json").read_text(encoding="utf-8")) == {"caption": "un café", "n": [1, 2]}
    assert "un café" in (tmp_path / "j.json").read_text(encoding="utf-8")  # non-ASCII kept readable
    assert leftovers(tmp_path) == []


def test_atomic_write_replaces_and_gets_the_usual_mode(tmp_path):
    path = tmp_path / "x.txt"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    umask = os.umask(0)
    os.umask(umask)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~umask)


def test_atomic_write_leaves_the_process_umask_alone(tmp_path, monkeypatch):
    # the umask is process-wide: changing it, even for a moment, races with other threads' files
    monkeypatch.setattr(os, "umask", lambda *a: pytest.fail("os.umask was called"))
    atomic_write_text(tmp_path / "y.txt", "text")
    assert (tmp_path / "y.txt").read_text() == "text"


def test_failed_json_write_leaves_previous_file(tmp_path):
    path = tmp_path / "m.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert leftovers(tmp_path) == []


def test_safe_torch_load_round_trip(tmp_path):
    obj = {"state_dict": {"w": torch.arange(3)}, "vocabulary": {"itos": ["<pad>"], "min_freq": 5}}
    torch.save(obj, tmp_path / "c.ckpt")
    back = safe_torch_load(tmp_path / "c.ckpt")
    assert torch.equal(back["state_dict"]["w"], torch.arange(3)) and back["vocabulary"] == obj["vocabulary"]


def one_line_error(path):
    with pytest.raises(CheckpointError) as info:
        safe_torch_load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_safe_torch_load_refuses_code(tmp_path):
    torch.save({"x": NotWeights()}, tmp_path / "evil.pt")
    with open(tmp_path / "legacy.pt", "wb") as f:
        pickle.dump({"x": NotWeights()}, f, protocol=2)
    for name in ("evil.pt", "legacy.pt"):
        assert "refused to load: not a plain-weights checkpoint" in one_line_error(tmp_path / name)
    assert "NotWeights" in one_line_error(tmp_path / "evil.pt")


def test_a_legacy_pickle_is_refused_unread(tmp_path, monkeypatch):
    torch.save({"w": torch.zeros(3)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called on a legacy pickle"))
    message = one_line_error(tmp_path / "old.pt")
    assert "refused to load" in message and "legacy pickle" in message


def test_legacy_weight_files_are_read_weights_only_when_allowed(tmp_path):
    # third-party weight files (an encoder's ImageNet weights) may be in torch.save's older format
    torch.save({"w": torch.ones(2)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert torch.equal(safe_torch_load(tmp_path / "old.pt", legacy_pickle=True)["w"], torch.ones(2))
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"x": NotWeights()}, f, protocol=2)
    with pytest.raises(CheckpointError, match="refused to load: not a plain-weights checkpoint"):
        safe_torch_load(tmp_path / "evil.pt", legacy_pickle=True)


def test_safe_torch_load_bad_files(tmp_path):
    assert one_line_error(tmp_path / "missing.ckpt").endswith(": no such file")
    assert "directory" in one_line_error(tmp_path)
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert "empty file" in one_line_error(tmp_path / "empty.ckpt")
    (tmp_path / "junk.ckpt").write_bytes(b"hello, this is not a checkpoint")
    assert "not a checkpoint file" in one_line_error(tmp_path / "junk.ckpt")  # not even the format of one
    torch.save({"w": torch.zeros(100)}, tmp_path / "good.ckpt")
    (tmp_path / "cut.ckpt").write_bytes((tmp_path / "good.ckpt").read_bytes()[:200])
    assert "not a readable checkpoint" in one_line_error(tmp_path / "cut.ckpt")


def test_plain_json_turns_tensors_numpy_and_tuples_into_json_types():
    import math

    import numpy as np

    from captioning.files import plain_json

    value = {1: (torch.tensor(2.5), np.float32(0.25), torch.tensor([1, 2]), np.array([[3]]), float("nan"), Path("x"))}
    kept = plain_json(value)
    assert list(kept) == ["1"] and kept["1"][:4] == [2.5, 0.25, [1, 2], 3] and math.isnan(kept["1"][4])
    assert kept["1"][5] == Path("x")  # without strict, other objects are left as they are
    strict = plain_json(value, strict=True)
    assert strict["1"][4] is None and strict["1"][5] == "x"
    json.dumps(strict, allow_nan=False)  # strict values are plain JSON


# ------------------------------------------------------------------------- JSON read totally, one helper
def _model_folder(path):
    """A folder whose config.json is ``path``'s contents (layout.read_config reads it first)."""
    from captioning.storage.layout import read_config

    folder = path.parent / "model"
    folder.mkdir(exist_ok=True)
    os.replace(path, folder / "config.json")
    return read_config(str(folder))


def _out_file(path):
    from captioning.data.captions_out import CaptionsFile

    jsonl = path.with_suffix(".jsonl")
    os.replace(path, jsonl)
    return CaptionsFile(jsonl).check()


def _readers():
    from captioning.data.features.reader import read_index
    from captioning.data.formats import load_records
    from captioning.errors import AnnotationError, ConfigError
    from captioning.evaluation.results_files import read_results
    from captioning.metrics.chair import read_instances
    from captioning.vocab import Vocabulary

    return {
        "vocabulary (fit --data.vocabulary)": (Vocabulary.load, ConfigError),
        "model folder config.json": (_model_folder, CheckpointError),
        "results file (score, compare)": (read_results, AnnotationError),
        "CHAIR instances (--instances)": (read_instances, AnnotationError),
        "feature-cache index": (read_index, ConfigError),
        "annotation file": (load_records, AnnotationError),
        "caption --out line": (_out_file, ConfigError),
    }


#: contents no reader can use: as deep as the parser cannot go, more digits than Python converts,
#: bytes that are not UTF-8, a value of another type, nothing, a cut file
BAD_JSON = {
    "200,000 nested brackets": b"[" * 200_000 + b"]" * 200_000 + b"\n",
    "a 5,000-digit integer": b'{"itos": ' + b"7" * 5000 + b', "image_ids": ' + b"7" * 5000 + b"}\n",
    "Latin-1 bytes": b'{"name": "caf\xe9"}\n',
    "a number": b"5\n",
    "empty": b"",
    "cut": b'{"itos": ["<pad>", \n',
}


@pytest.mark.parametrize("reader", list(_readers()))
@pytest.mark.parametrize("content", list(BAD_JSON))
def test_every_json_reader_answers_any_bytes_in_one_line(tmp_path, reader, content):
    read, error = _readers()[reader]
    path = tmp_path / "file.json"
    path.write_bytes(BAD_JSON[content])
    if reader == "caption --out line" and content == "empty":  # an empty --out is a run's that wrote nothing
        assert len(read(path)) == 0
        return
    with pytest.raises(error) as info:
        read(path)
    message = str(info.value)
    assert "\n" not in message and len(message) < 600 and ("file.json" in message or "model" in message)


def test_a_pipe_or_a_folder_is_not_read_as_json(tmp_path):
    from captioning.errors import ConfigError
    from captioning.files import read_json_file

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # reading it would wait for a writer for ever
    for path, expected in ((fifo, "not a regular file"), (tmp_path, "is a directory"), (tmp_path / "x", "no such")):
        with pytest.raises(ConfigError, match=expected):
            read_json_file(path, ConfigError)


def test_a_holdout_of_any_form_is_no_holdout(tmp_path):
    from captioning.data.shapes.holdout import read_holdout

    path = tmp_path / "dataset_shapes.json"
    for content in list(BAD_JSON.values()) + [b'{"holdout": 5}', b'{"holdout": {"red": 1}}', b'{"holdout": [3]}']:
        path.write_bytes(content)
        assert read_holdout(str(path)) == ()
    path.write_text('{"holdout": ["red:circle", 7, "blue:square"]}')
    assert read_holdout(str(path)) == (("red", "circle"), ("blue", "square"))


def test_printable_names_are_one_line_and_keep_their_bytes_visible():
    from captioning.files import printable

    assert printable("plain/name.jpg") == "plain/name.jpg" and printable("照片.jpg") == "照片.jpg"
    assert printable("a\nb\tc\x1b[31m") == "a\\nb\\tc\\x1b[31m"
    assert printable(os.fsdecode(b"caf\xe9.png")) == "caf\\xe9.png"
    assert printable("x\u202egnp.exe") == "x\\u202egnp.exe"  # a right-to-left override hides nothing
    cut = printable("a" * 10_000 + "END", limit=100)
    assert len(cut) <= 100 and cut.startswith("aaa") and cut.endswith("END") and "..." in cut
