"""Curves and validation pictures reach every logger kind: CSV, Weights & Biases offline, MLflow's file store
(TensorBoard's: tests/training/test_output.py)."""

import time

import pytest

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def tracked_run(tiny_shapes, tmp_path_factory, monkeypatch_module):
    """One short fit logging to a CSV logger, W&B offline and an MLflow file store at once."""
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    root = tmp_path_factory.mktemp("tracking")
    monkeypatch_module.setenv("WANDB_SILENT", "true")
    monkeypatch_module.setenv("WANDB_MODE", "offline")
    monkeypatch_module.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it to write a file store
    loggers = root / "loggers.yaml"
    loggers.write_text(
        "trainer:\n  logger:\n"
        f"    - {{class_path: lightning.pytorch.loggers.CSVLogger, init_args: {{save_dir: '{root / 'csv'}'}}}}\n"
        "    - {class_path: lightning.pytorch.loggers.WandbLogger,"
        f" init_args: {{offline: true, save_dir: '{root}', project: captioning-test}}}}\n"
        "    - {class_path: lightning.pytorch.loggers.MLFlowLogger,"
        f" init_args: {{tracking_uri: 'file:{root / 'mlruns'}', experiment_name: captioning-test}}}}\n"
    )
    run_lightning_cli(
        fit_args(
            tiny_shapes, root / "fit", steps=2, extra=["--config", str(loggers), "--trainer.log_every_n_steps", "1"]
        )
    )
    import wandb

    wandb.finish()  # the offline run's file is written in the background: complete it before reading
    return root


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_csv_gets_curves_and_picture_files(tracked_run):
    (version,) = (tracked_run / "csv" / "lightning_logs").iterdir()
    header = (version / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "train/loss" in header and "val/CIDEr" in header
    pictures = sorted(version.glob("val_examples/*/step_*.png"))
    assert len(pictures) == 4


def test_wandb_offline_gets_curves_and_pictures(tracked_run):
    (run,) = (tracked_run / "wandb").glob("offline-run-*")
    images = list(run.glob("files/media/images/val_examples/*.png"))
    assert len(images) == 4
    (history,) = run.glob("*.wandb")
    # W&B's service process writes the offline history in the background, after wandb.finish() returns
    # on a busy machine: wait for it (up to a minute) before reading
    deadline = time.monotonic() + 60
    while not (b"val/CIDEr" in history.read_bytes() and b"train/loss" in history.read_bytes()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    data = history.read_bytes()
    assert b"val/CIDEr" in data and b"train/loss" in data


def test_mlflow_file_store_gets_curves_and_pictures(tracked_run):
    runs = [p for p in (tracked_run / "mlruns").glob("*/*") if (p / "artifacts").is_dir()]
    assert len(runs) == 1
    assert (runs[0] / "metrics" / "val" / "CIDEr").is_file() and (runs[0] / "metrics" / "train" / "loss").is_file()
    assert len(list((runs[0] / "artifacts" / "val_examples").glob("*/step_*.png"))) == 4
