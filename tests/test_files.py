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
