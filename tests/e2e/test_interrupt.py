"""Stopping a run: SIGTERM (as a cluster's scheduler sends) or Ctrl-C mid-epoch writes last.ckpt at
the end of the step under way and exits; resuming from it ends exactly where an uninterrupted run ends."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from captioning.files import safe_torch_load
from tests.helpers import fit_args

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH, EPOCHS = 4, 2


def args(annotations, root, extra=()):
    return fit_args(annotations, root, config="shapes_hard.yaml", steps=STEPS_PER_EPOCH, extra=[
        "--trainer.max_epochs", str(EPOCHS), "--trainer.deterministic", "true", "--model.decoder.dropout", "0.1",
        "--trainer.enable_progress_bar", "true", "--trainer.log_every_n_steps", "1", *extra])


def popen(argv):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-m", "captioning.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


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
