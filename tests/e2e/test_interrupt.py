"""Stopping a run: SIGTERM (as a cluster's scheduler sends) or Ctrl-C mid-epoch writes last.ckpt at
the end of the step under way and exits; resuming from it ends exactly where an uninterrupted run ends,
also when the signal comes inside a validation with the weights' moving average swapped in."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from captioning.files import safe_torch_load
from tests.helpers import fit_args

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH, EPOCHS = 4, 2


def args(annotations, root, extra=()):
    return fit_args(
        annotations,
        root,
        config="shapes_hard.yaml",
        steps=STEPS_PER_EPOCH,
        extra=[
            "--trainer.max_epochs",
            str(EPOCHS),
            "--trainer.deterministic",
            "true",
            "--model.decoder.dropout",
            "0.1",
            "--trainer.enable_progress_bar",
            "true",
            "--trainer.log_every_n_steps",
            "1",
            *extra,
        ],
    )


def popen(argv):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(
        [sys.executable, "-m", "captioning.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_run_resumes_to_the_uninterrupted_result(sig, tiny_shapes, tmp_path):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    a = popen(args(tiny_shapes, whole))
    b = popen(args(tiny_shapes, stopped))
    deadline = time.time() + 240
    for line in b.stdout:  # plain progress lines: "epoch E  step S  loss ..."
        if line.startswith(f"epoch 1  step {STEPS_PER_EPOCH + 2} "):  # inside the second epoch
            b.send_signal(sig)
            break
        assert time.time() < deadline, "the run did not reach the second epoch"
    rest, err = b.communicate(timeout=120)
    assert b.returncode == 128 + sig, err[-2000:]
    assert f"{signal.Signals(sig).name}: stopped after step" in rest and "--ckpt_path" in rest
    last = stopped / "checkpoints" / "last.ckpt"
    at_stop = safe_torch_load(last)
    assert STEPS_PER_EPOCH < at_stop["global_step"] < STEPS_PER_EPOCH * EPOCHS, "not stopped mid-epoch"
    assert not list((stopped / "checkpoints").glob("*.tmp"))

    resumed = popen(args(tiny_shapes, stopped, ["--ckpt_path", str(last)]))
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    _, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-2000:]
    expected, got = safe_torch_load(whole / "checkpoints" / "last.ckpt"), safe_torch_load(last)
    assert got["global_step"] == expected["global_step"] == STEPS_PER_EPOCH * EPOCHS
    for k, v in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][k], v), k


class AnnounceValidation(Callback):
    """In the run to be stopped: prints ``validating after step S`` at the first batch of each
    validation (not the sanity check), then waits ``pause`` seconds there, so that a signal sent on
    reading the line arrives inside the validation."""

    def __init__(self, pause: float = 3.0):
        self.pause = pause

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and not trainer.sanity_checking:
            print(f"validating after step {trainer.global_step}", flush=True)
            time.sleep(self.pause)


def test_a_run_stopped_inside_validation_with_the_average_on_resumes_exactly(tiny_shapes, tmp_path):
    """SIGTERM inside the validation at the end of epoch 0, with the weights' moving average on (the
    average is swapped in for validation): last.ckpt holds the average as the model and the training
    weights beside it, as the uninterrupted run's checkpoint of that step does, and the resumed run
    ends with the uninterrupted run's average, training weights and optimizer state."""
    ema = ["--model.optimizer.ema_decay", "0.5", "--model.optimizer.ema_start_step", "1"]
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    every_step = [
        "--trainer.callbacks+=ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps",
        "1",
        "--trainer.callbacks.save_top_k",
        "-1",
        "--trainer.callbacks.filename",
        "{step}",
    ]
    a = popen(args(tiny_shapes, whole, [*ema, *every_step]))
    b = popen(args(tiny_shapes, stopped, [*ema, f"--trainer.callbacks+={__name__}.AnnounceValidation"]))
    deadline = time.time() + 240
    for line in b.stdout:
        if line.startswith(f"validating after step {STEPS_PER_EPOCH}"):
            b.send_signal(signal.SIGTERM)
            break
        assert time.time() < deadline, "the run did not reach the first validation"
    rest, err = b.communicate(timeout=120)
    assert b.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert f"SIGTERM: stopped after step {STEPS_PER_EPOCH}" in rest
    last = stopped / "checkpoints" / "last.ckpt"
    at_stop = safe_torch_load(last)
    assert at_stop["global_step"] == STEPS_PER_EPOCH
    assert at_stop["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]["current"]["completed"] == 0
    assert a.wait(300) == 0, a.stderr.read()[-2000:]
    reference = safe_torch_load(whole / "checkpoints" / f"step={STEPS_PER_EPOCH}.ckpt")  # the uninterrupted run then
    for key in ("state_dict", "current_model_state"):
        for name, value in reference[key].items():
            assert torch.equal(at_stop[key][name], value), f"{key} {name}"

    resumed = popen(args(tiny_shapes, stopped, [*ema, "--ckpt_path", str(last)]))
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    expected = safe_torch_load(whole / "checkpoints" / f"step={STEPS_PER_EPOCH * EPOCHS}.ckpt")
    got = safe_torch_load(last)
    assert got["global_step"] == expected["global_step"] == STEPS_PER_EPOCH * EPOCHS
    for key in ("state_dict", "current_model_state"):
        for name, value in expected[key].items():
            assert torch.equal(got[key][name], value), f"{key} {name}"
    for x, y in zip(expected["optimizer_states"][0]["state"].values(), got["optimizer_states"][0]["state"].values()):
        assert torch.equal(x["exp_avg"], y["exp_avg"]) and torch.equal(x["exp_avg_sq"], y["exp_avg_sq"])
