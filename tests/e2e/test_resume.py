"""A training run killed with SIGKILL mid-epoch resumes with one command and ends where an
uninterrupted run ends.

What Lightning 2.x restores from last.ckpt: weights and buffers (the REINFORCE baseline), the
optimizer, the loop counters (global step, epoch, batch within the epoch), every callback's state
(the best-by-CIDEr bookkeeping) and the state of a loader with state_dict/load_state_dict. The
training loader is such a loader (captioning/data/sampling.py: the epoch's order comes from the
seed and the epoch, and it skips the batches already served), and the module reseeds its random
draws from the run's seed, the global step and the rank, so the resumed run ends with the same weights.
"""

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
TOTAL = STEPS_PER_EPOCH * EPOCHS


def args(annotations, root, extra=()):
    """Hard attention (a REINFORCE baseline to keep), no dropout, last.ckpt after every step."""
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
            "--trainer.check_val_every_n_epoch",
            "1",
            "--model.decoder.dropout",
            "0.0",
            "--model.val_generation.max_new_tokens",
            "6",
            "--model.test_generation.max_new_tokens",
            "6",
            # two ModelCheckpoints replace the default one: the best by CIDEr, and last.ckpt after every step
            "--trainer.callbacks+=ModelCheckpoint",
            "--trainer.callbacks.monitor",
            "val/CIDEr",
            "--trainer.callbacks.mode",
            "max",
            "--trainer.callbacks.filename",
            "best-{epoch}-{step}",
            "--trainer.callbacks+=ModelCheckpoint",
            "--trainer.callbacks.every_n_train_steps",
            "1",
            "--trainer.callbacks.save_last",
            "true",
            "--trainer.callbacks.save_top_k",
            "0",
            *extra,
        ],
    )


def popen(argv):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(
        [sys.executable, "-m", "captioning.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def read_step(path: Path):
    try:  # the file may be half written while we look
        return safe_torch_load(path)["global_step"]
    except Exception:
        return None


def best_state(ckpt: dict) -> dict:
    """The state of the best-by-CIDEr ModelCheckpoint inside a checkpoint."""
    (state,) = [v for k, v in ckpt["callbacks"].items() if "val/CIDEr" in k]
    return state


@pytest.fixture(scope="module")
def runs(tiny_shapes, tmp_path_factory):
    """(uninterrupted last.ckpt, checkpoint the killed run left, resumed last.ckpt)."""
    whole = tmp_path_factory.mktemp("whole")
    killed = tmp_path_factory.mktemp("killed")
    a = popen(args(tiny_shapes, whole))  # the two runs share the machine's cores
    b = popen(args(tiny_shapes, killed))
    last = killed / "checkpoints" / "last.ckpt"
    deadline = time.time() + 240
    while time.time() < deadline:
        step = read_step(last) if last.exists() else None
        if step is not None and step > STEPS_PER_EPOCH:  # inside the second epoch
            os.kill(b.pid, signal.SIGKILL)
            break
        if b.poll() is not None:
            pytest.fail(f"the run to be killed ended by itself: {b.stderr.read()[-2000:]}")
        time.sleep(0.05)
    b.wait(30)
    assert b.returncode == -signal.SIGKILL
    at_kill = safe_torch_load(last)
    assert STEPS_PER_EPOCH < at_kill["global_step"] < TOTAL, "not killed mid-epoch"
    assert a.wait(300) == 0, a.stderr.read()[-2000:]

    resumed = popen(args(tiny_shapes, killed, ["--ckpt_path", "last"]))  # the one resume command
    assert resumed.wait(300) == 0, resumed.stderr.read()[-2000:]
    return safe_torch_load(whole / "checkpoints" / "last.ckpt"), at_kill, safe_torch_load(last)


def test_resumed_run_ends_at_the_same_step_and_epoch(runs):
    whole, at_kill, resumed = runs
    assert resumed["global_step"] == whole["global_step"] == TOTAL
    assert resumed["epoch"] == whole["epoch"]
    done = resumed["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"]
    assert done == whole["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"]


def test_baseline_and_optimizer_survive_the_kill(runs, tiny_shapes, tmp_path):
    """Resuming restores the REINFORCE baseline and Adam's moments exactly (max_steps already reached:
    the resumed trainer restores the checkpoint and trains no further)."""
    from captioning.training.cli import run_lightning_cli

    _, at_kill, _ = runs
    path = tmp_path / "at_kill.ckpt"
    torch.save(at_kill, path)
    assert at_kill["state_dict"]["objective.baseline"].item() != 0.0  # REINFORCE has moved it
    cli = run_lightning_cli(
        args(tiny_shapes, tmp_path, ["--trainer.max_steps", str(at_kill["global_step"]), "--ckpt_path", str(path)])
    )
    state = cli.model.state_dict()
    for k, v in at_kill["state_dict"].items():
        assert torch.equal(state[k], v), k
    assert cli.trainer.global_step == at_kill["global_step"]
    adam = cli.trainer.optimizers[0].state_dict()["state"]
    saved = at_kill["optimizer_states"][0]["state"]
    assert adam.keys() == saved.keys()
    assert all(torch.equal(adam[i]["exp_avg"], saved[i]["exp_avg"]) for i in saved)


def test_best_checkpoint_bookkeeping_survives(runs):
    whole, at_kill, resumed = runs
    before, after, reference = best_state(at_kill), best_state(resumed), best_state(whole)
    # epoch 0 ended (and was validated) before the kill: its score is the same as the whole run's
    assert before["best_model_path"].endswith("best-epoch=0-step=4.ckpt")
    assert "best-epoch=0-step=4.ckpt" in str(reference["best_k_models"])
    assert float(before["best_model_score"]) in [float(s) for s in reference["best_k_models"].values()]
    # the resumed run still knows the epoch-0 checkpoint and compares epoch 1 against it
    assert float(after["best_model_score"]) >= float(before["best_model_score"])
    # and it keeps the same bookkeeping as the uninterrupted run (last.ckpt is written at the last
    # step, before that epoch's validation, in both runs)
    assert Path(after["best_model_path"]).name == Path(reference["best_model_path"]).name
    assert float(after["best_model_score"]) == float(reference["best_model_score"])
    assert len(after["best_k_models"]) == len(reference["best_k_models"])


def test_resumed_weights_equal_uninterrupted_weights(runs):
    whole, _, resumed = runs
    for k, v in whole["state_dict"].items():
        assert torch.allclose(resumed["state_dict"][k].float(), v.float(), atol=1e-5), k
