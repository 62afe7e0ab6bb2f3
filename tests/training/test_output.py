"""What a training run shows a person: plain progress lines in a log file, where its files go,
TensorBoard curves and validation examples, the demo's curves picture."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioning.training.cli import run_lightning_cli
from captioning.viz.curves import plot_curves, read_scalars
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def logged_run(tiny_shapes, tmp_path_factory):
    import contextlib
    import io

    root = tmp_path_factory.mktemp("logged")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # not a terminal, as when the output goes to a file
        cli = run_lightning_cli(
            [
                "fit",
                "--config",
                str(ROOT / "configs" / "shapes_soft.yaml"),
                "--data.annotations",
                str(tiny_shapes),
                "--data.batch_size",
                "8",
                "--data.num_workers",
                "0",
                "--trainer.default_root_dir",
                str(root),
                "--trainer.max_epochs",
                "2",
                "--trainer.log_every_n_steps",
                "5",
                "--trainer.accelerator",
                "cpu",
                "--model.val_generation.max_new_tokens",
                "8",
            ]
        )
    return cli, out.getvalue()


def test_progress_is_plain_lines_and_says_where_files_go(logged_run):
    cli, text = logged_run
    assert "\r" not in text  # nothing repaints
    lines = text.splitlines()
    assert any(line.startswith("checkpoints: ") and "checkpoints" in line for line in lines)
    assert any(line.startswith("logs: ") and "tensorboard --logdir" in line for line in lines)
    steps = [line for line in lines if line.startswith("epoch ") and " step " in line and "loss " in line]
    assert len(steps) >= 5  # a line every 5 of the ~25 steps
    assert sum(line.startswith("validation after step") and "CIDEr" in line for line in lines) == 2
    assert "Tip:" not in text and "litlogger" not in text


def test_tensorboard_gets_curves_and_validation_examples(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cli, _ = logged_run
    scalars = read_scalars(cli.trainer.log_dir)
    assert {"train/loss", "val/CIDEr", "val/BLEU-4", "val/object_f1"} <= set(scalars)
    assert len(scalars["val/CIDEr"][0]) == 2  # one point per validation
    events = EventAccumulator(cli.trainer.log_dir, size_guidance={"images": 0})
    events.Reload()
    assert sorted(events.Tags()["images"]) == [f"val_examples/{i}" for i in range(4)]
    first = events.Images("val_examples/0")
    assert len(first) == 2 and first[-1].width > first[-1].height  # a row of word panels, each validation


def test_curves_picture_has_a_panel_per_logged_scalar(logged_run, tmp_path):
    cli, _ = logged_run
    picture = plot_curves(cli.trainer.log_dir, tmp_path / "curves.png")
    with Image.open(tmp_path / "curves.png") as saved:
        assert saved.size == picture.size == (2 * 520, 2 * 300)  # loss, CIDEr, BLEU-4, object F1
    pixels = np.asarray(picture)
    assert (pixels < 200).any(axis=-1).mean() > 0.01  # lines and text drawn, not a blank page


def test_enable_checkpointing_false_trains_and_writes_no_checkpoint(tiny_shapes, tmp_path):
    """The default ModelCheckpoint is not added when checkpointing is switched off (Lightning refuses
    a ModelCheckpoint with enable_checkpointing=False)."""
    from tests.helpers import fit_args

    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, steps=2, extra=["--trainer.enable_checkpointing", "false"]))
    assert cli.trainer.global_step > 0
    assert cli.trainer.checkpoint_callback is None
    assert not list(tmp_path.rglob("*.ckpt"))


def test_last_checkpoint_is_the_run_s_last_step(logged_run):
    """last.ckpt is rewritten after every validation, not only when a best checkpoint is saved."""
    import torch

    cli, _ = logged_run
    folder = cli.trainer.checkpoint_callback.dirpath
    last = torch.load(f"{folder}/last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == cli.trainer.global_step
    assert last["epoch"] == cli.trainer.current_epoch - 1 or last["epoch"] == cli.trainer.current_epoch


def test_ckpt_path_last_finds_the_previous_version_folder(tiny_shapes, tmp_path, capsys):
    from captioning.cli import main
    from tests.helpers import fit_args

    logged = ["--trainer.logger", "true"]  # TensorBoard: each run its own version_N folder
    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, steps=2, extra=logged))
    first = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    assert first.is_file() and "version_0" in str(first)
    cli = run_lightning_cli(
        fit_args(tiny_shapes, tmp_path, steps=2, extra=[*logged, "--ckpt_path", "last", "--trainer.max_epochs", "2"])
    )
    assert f"resuming from {first}" in capsys.readouterr().out
    assert cli.trainer.global_step == 4  # two steps restored, two more trained
    assert main(fit_args(tiny_shapes, tmp_path / "empty", steps=2, extra=["--ckpt_path", "last"])) != 0
    err = capsys.readouterr().err.strip()
    assert "--ckpt_path last: no last.ckpt under" in err and len(err.splitlines()) == 1


def test_validation_examples_of_a_shard_dataset_are_read_from_its_shards(tiny_shapes, tmp_path):
    """Shards hold their images: the pictures read them through the data's own route (an images
    folder beside the annotations would not have them)."""
    pytest.importorskip("webdataset", reason="the ecosystem extra: pip install -e '.[ecosystem]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from captioning.cli import main
    from tests.helpers import fit_args

    shards = tmp_path / "shards"
    assert (
        main(
            [
                "prepare",
                "--annotations",
                str(tiny_shapes),
                "--min-word-freq",
                "1",
                "--to-webdataset",
                str(shards),
                "--shard-size",
                "16",
            ]
        )
        == 0
    )
    cli = run_lightning_cli(fit_args(shards, tmp_path / "run", steps=2, extra=["--trainer.logger", "true"]))
    events = EventAccumulator(cli.trainer.log_dir, size_guidance={"images": 0})
    events.Reload()
    assert sorted(events.Tags()["images"]) == [f"val_examples/{i}" for i in range(4)]
    assert events.Images("val_examples/0")[-1].width > events.Images("val_examples/0")[-1].height


def test_validation_examples_that_cannot_be_read_are_one_warning(tiny_shapes, tmp_path, caplog):
    import shutil

    from captioning.data.captions import CaptionData
    from tests.helpers import fit_args

    data = tmp_path / "data"
    shutil.copytree(tiny_shapes.parent, data)
    copy = CaptionData(str(data / tiny_shapes.name), min_word_freq=1)
    for record in copy.records("val")[:4]:  # the pictures' images; the other validation images score
        (Path(copy.images_root) / record.path).write_bytes(b"not an image")
    with caplog.at_level("WARNING", logger="captioning.training.callbacks"):
        run_lightning_cli(
            fit_args(
                data / tiny_shapes.name,
                tmp_path / "run",
                steps=2,
                extra=["--trainer.logger", "true", "--trainer.max_epochs", "2", "--data.on_bad_image", "skip"],
            )
        )
    warnings = [r for r in caplog.records if r.name == "captioning.training.callbacks"]
    assert len(warnings) == 1 and "none of the first 4 validation images could be read" in warnings[0].getMessage()
