"""Shared fixtures: tiny shapes datasets and a briefly trained checkpoint, made once per session."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("PYTHONWARNINGS", "ignore")


def threads_per_worker() -> int:
    """The cores of the machine split between pytest-xdist's workers (all of them without xdist)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


# Workers that each used every core would fight over them (torch's threads spin while they wait).
# Set before torch is imported, and inherited by the servers and training runs the tests start.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_worker()))


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory) -> Path:
    """A shapes dataset of 40/8/8 images at 64 px; returns the annotation file."""
    from captioning.data.shapes import generate

    return generate(
        tmp_path_factory.mktemp("shapes"), n_train=40, n_val=8, n_test=8, seed=3, image_size=64, progress=False
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_shapes, tmp_path_factory) -> Path:
    """A soft-attention checkpoint after a few training steps on the tiny shapes data."""
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    root = tmp_path_factory.mktemp("fit")
    cli = run_lightning_cli(fit_args(tiny_shapes, root, steps=3))
    path = Path(cli.trainer.checkpoint_callback.last_model_path)
    assert path.is_file()
    return path


@pytest.fixture(scope="session")
def tiny_shapes_zh(tmp_path_factory) -> Path:
    """The tiny shapes dataset's images with Chinese captions (make-shapes --language zh)."""
    from captioning.data.shapes import generate

    return generate(
        tmp_path_factory.mktemp("shapes_zh"),
        n_train=40,
        n_val=8,
        n_test=8,
        seed=3,
        image_size=64,
        progress=False,
        language="zh",
    )


@pytest.fixture(scope="session")
def tiny_zh_checkpoint(tiny_shapes_zh, tmp_path_factory) -> Path:
    """A Chinese soft-attention checkpoint (configs/shapes_soft_zh.yaml, one token per character:
    no optional package needed) after a few training steps."""
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    root = tmp_path_factory.mktemp("fit_zh")
    cli = run_lightning_cli(
        fit_args(tiny_shapes_zh, root, config="shapes_soft_zh.yaml", steps=3, extra=["--data.tokenizer", "chars"])
    )
    path = Path(cli.trainer.checkpoint_callback.last_model_path)
    assert path.is_file()
    return path
