"""Captioner.caption_files: a generator over files, folders, globs, @lists and shards, in input order,
with the results of Captioner.__call__, errors as items, and paths read as it goes."""

import itertools
import shutil

import pytest

from captioning.api import Captioner
from captioning.errors import ConfigError


@pytest.fixture(scope="module")
def captioner(tiny_checkpoint):
    return Captioner.from_checkpoint(tiny_checkpoint, "cpu")


@pytest.fixture
def folder(tiny_shapes, tmp_path):
    root = tmp_path / "photos"
    for i, p in enumerate(sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[:5]):
        (root / f"part{i % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(p, root / f"part{i % 2}" / p.name)
    (root / "part1" / "zz_broken.png").write_bytes(b"broken")
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_results_match_call_in_input_order_with_errors_as_items(captioner, folder, workers):
    paths = sorted(str(p) for p in folder.rglob("*.png"))
    got = list(captioner.caption_files(folder, batch_size=2, num_workers=workers, num_beams=2, max_new_tokens=6))
    assert [r["image"] for r in got] == paths
    good = [p for p in paths if not p.endswith("zz_broken.png")]
    expected = captioner(good, num_beams=2, max_new_tokens=6)
    assert [r["generated_text"] for r in got if "error" not in r] == [e["generated_text"] for e in expected]
    assert [r["score"] for r in got if "error" not in r] == pytest.approx([e["score"] for e in expected], abs=1e-5)
    [bad] = [r for r in got if "error" in r]
    assert bad["image"].endswith("zz_broken.png") and "zz_broken.png" in bad["error"]


def test_paths_are_read_as_the_results_are_taken(captioner, folder):
    one = str(next(folder.rglob("*.png")))
    endless = itertools.cycle([one])  # never ends: only a stream can give its first results
    first = list(itertools.islice(captioner.caption_files(endless, batch_size=3, max_new_tokens=4), 7))
    assert len(first) == 7 and len({r["generated_text"] for r in first}) == 1


def test_skip_attention_and_empty_arguments(captioner, folder, tmp_path):
    paths = sorted(str(p) for p in folder.rglob("*.png"))
    (tmp_path / "empty").mkdir()
    got = list(captioner.caption_files([folder, tmp_path / "empty"], skip={paths[0]}, return_attention=True))
    assert [r["image"] for r in got] == paths[1:] + [str(tmp_path / "empty")]
    assert "no images found" in got[-1]["error"]
    assert all(r["attention"].ndim == 3 for r in got if "generated_text" in r)


def test_bad_settings_are_one_line_before_any_image(captioner, folder):
    with pytest.raises(ConfigError, match="batch_size"):
        next(captioner.caption_files(folder, batch_size=0))
    with pytest.raises(ConfigError, match="num_beams"):
        next(captioner.caption_files(folder, num_beams=0))
