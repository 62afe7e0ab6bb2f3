"""`captioning evaluate --server-results coco|nocaps`: the captions as an evaluation server's
submission file (its name, integer image ids, one caption per image), wrong values one line each."""

import json

import pytest

from captioning.cli import main
from captioning.cli.evaluate import write_server_results
from captioning.errors import ConfigError


def test_evaluate_writes_the_coco_server_file(tiny_checkpoint, tiny_shapes, tmp_path, capsys):
    results = tmp_path / "results.json"
    code = main(
        [
            "evaluate",
            "--checkpoint",
            str(tiny_checkpoint),
            "--annotations",
            str(tiny_shapes),
            "--split",
            "test",
            "--max-new-tokens",
            "6",
            "--results",
            str(results),
            "--server-results",
            "coco",
            "--server-subset",
            "test2014",
            "--server-name",
            "mymodel",
            "--server-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    path = tmp_path / "captions_test2014_mymodel_results.json"
    rows = json.loads(path.read_text())
    assert all(isinstance(r["image_id"], int) and isinstance(r["caption"], str) for r in rows)
    assert [r["image_id"] for r in rows] == sorted({r["image_id"] for r in rows})  # one caption per image
    assert {(r["image_id"], r["caption"]) for r in rows} == {
        (r["image_id"], r["caption"]) for r in json.loads(results.read_text())
    }
    assert str(path) in capsys.readouterr().err


def test_nocaps_file_and_wrong_values(tmp_path):
    path = write_server_results({3: "a dog", 1: "a cat"}, "nocaps", None, "m", str(tmp_path))
    assert path.endswith("nocaps_val_m_results.json")
    assert json.loads(open(path).read()) == [{"image_id": 1, "caption": "a cat"}, {"image_id": 3, "caption": "a dog"}]
    with pytest.raises(ConfigError, match="subsets are val2014, test2014"):
        write_server_results({1: "a"}, "coco", "train2014", "m", str(tmp_path))
    with pytest.raises(ConfigError, match="--server-name"):
        write_server_results({1: "a"}, "coco", None, "../x", str(tmp_path))
    with pytest.raises(ConfigError, match="no captions"):
        write_server_results({}, "coco", None, "m", str(tmp_path))


def test_an_unknown_server_is_one_line(tiny_checkpoint, tiny_shapes, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "evaluate",
                "--checkpoint",
                str(tiny_checkpoint),
                "--annotations",
                str(tiny_shapes),
                "--server-results",
                "flickr",
            ]
        )
    assert exit_.value.code != 0 and "invalid choice" in capsys.readouterr().err


def test_server_settings_are_checked_before_decoding(tiny_checkpoint, tiny_shapes, monkeypatch, capsys):
    import captioning.cli.evaluate as command

    monkeypatch.setattr(command, "evaluate", lambda *a, **k: pytest.fail("the split was decoded before the check"))
    code = main(
        [
            "evaluate",
            "--checkpoint",
            str(tiny_checkpoint),
            "--annotations",
            str(tiny_shapes),
            "--server-results",
            "coco",
            "--server-subset",
            "train2014",
        ]
    )
    assert code == 1 and "--server-subset" in capsys.readouterr().err
