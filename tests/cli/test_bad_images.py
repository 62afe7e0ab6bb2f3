"""Batch commands meet unreadable images: evaluate scores the rest and names each one; training with
data.on_bad_image=skip goes on and counts them."""

import json
import logging
import shutil

import pytest

from captioning.cli import main
from tests.helpers import fit_args


@pytest.fixture
def damaged_shapes(tiny_shapes, tmp_path):
    """A copy of the tiny shapes data with one test image deleted, one truncated, one train image corrupted."""
    root = tmp_path / "shapes"
    shutil.copytree(tiny_shapes.parent, root)
    test = sorted((root / "images" / "test").glob("*.png"))
    test[0].unlink()
    test[1].write_bytes(test[1].read_bytes()[:100])
    train = sorted((root / "images" / "train").glob("*.png"))
    for bad in train[::2]:  # half of them, so that the few steps of a test surely meet some
        bad.write_text("<html>not an image</html>")
    return root / tiny_shapes.name, test[0].name, test[1].name, [p.name for p in train[::2]]


def test_evaluate_skips_and_names_bad_images_and_scores_the_rest(damaged_shapes, tiny_checkpoint, tmp_path, capsys):
    annotations, missing, truncated, _ = damaged_shapes
    results = tmp_path / "results.json"
    code = main(
        [
            "evaluate",
            "--checkpoint",
            str(tiny_checkpoint),
            "--annotations",
            str(annotations),
            "--split",
            "test",
            "--num-beams",
            "1",
            "--max-new-tokens",
            "6",
            "--results",
            str(results),
        ]
    )
    out, err = capsys.readouterr()
    assert code != 0
    assert missing in err and truncated in err and "Traceback" not in err
    assert "CIDEr" in json.loads(out)
    rows = json.loads(results.read_text())
    assert len(rows) == 8 - 2  # the six readable test images were scored


def test_training_skips_a_corrupted_image_and_counts_it(damaged_shapes, tmp_path, caplog):
    from captioning.training.cli import run_lightning_cli

    annotations, _, _, bad_train = damaged_shapes
    with caplog.at_level(logging.WARNING, logger="captioning.data.datamodule"):
        cli = run_lightning_cli(
            fit_args(
                annotations,
                tmp_path,
                steps=5,
                extra=[
                    "--data.on_bad_image",
                    "skip",
                    "--trainer.limit_val_batches",
                    "0",
                    "--model.val_generation.max_new_tokens",
                    "4",
                    "--model.test_generation.max_new_tokens",
                    "4",
                ],
            )
        )
    assert cli.trainer.global_step >= 1
    dm = cli.datamodule
    named = [name for name in bad_train if name in caplog.text]
    assert dm.skipped_samples >= len(named) >= 1
    assert all(caplog.text.count(name) == 1 for name in named)  # each file named once, however often drawn


def test_training_stops_on_a_corrupted_image_by_default(damaged_shapes, tmp_path):
    annotations, _, _, bad_train = damaged_shapes
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "captioning.cli",
            *fit_args(annotations, tmp_path, steps=5, extra=["--trainer.limit_val_batches", "0"]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert any(name in proc.stderr.strip().splitlines()[-1] for name in bad_train)
