"""Long runs stopped and resumed safely: a resume that would not continue exactly is refused in one
line, ``--ckpt_path last`` stays in the run's own folders, checkpoints are written durably, SIGTERM
is acted on within seconds (during validation too) and a second one exits at once, and under DDP
the ranks agree on when to save and when to stop."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from captioning.cli import main
from captioning.errors import ConfigError
from captioning.files import safe_torch_load
from captioning.training.cli import run_lightning_cli
from tests.helpers import ROOT, fit_args


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------------- resume checks
@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--data.batch_size", "4"], "data.batch_size is 8 in the checkpoint, 4 here"),
        (["--seed_everything", "7"], "seed_everything is 0 in the checkpoint, 7 here (give --seed_everything 0)"),
        (["--data.image_size", "32"], "data.image_size is 64 in the checkpoint, 32 here"),
        (["--data.bucket_by_length", "true"], "data.bucket_by_length is False in the checkpoint, True here"),
    ],
)
def test_a_resume_that_changes_what_continuation_depends_on_is_refused(
    extra, expected, tiny_shapes, tiny_checkpoint, tmp_path, capsys
):
    err = one_line_error(
        capsys,
        fit_args(
            tiny_shapes,
            tmp_path,
            steps=2,
            extra=["--trainer.max_epochs", "2", "--ckpt_path", str(tiny_checkpoint), *extra],
        ),
    )
    assert f"{tiny_checkpoint}: cannot resume exactly: {expected}" in err
    assert not list(tmp_path.rglob("*.ckpt"))  # refused before anything was trained or written


def fit_from(tiny_shapes, root, checkpoint, extra=()):
    """``trainer.fit(..., ckpt_path=checkpoint)`` of a trainer built from the CLI's arguments. (``captioning
    fit --ckpt_path`` itself builds the model of the checkpoint's hyperparameters: Lightning's CLI
    puts them over the command line's model options.)"""
    cli = run_lightning_cli(fit_args(tiny_shapes, root, steps=2, extra=extra)[1:], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(checkpoint))


def test_another_architecture_is_refused_in_one_line(tiny_shapes, tiny_checkpoint, tmp_path):
    with pytest.raises(ConfigError) as refused:
        fit_from(tiny_shapes, tmp_path, tiny_checkpoint, ["--model.decoder.hidden_dim", "64"])
    assert str(refused.value) == (
        f"{tiny_checkpoint}: cannot resume exactly: model: decoder.hidden_dim is 256 in the "
        "checkpoint, 64 here; resume with the checkpoint's settings, or start a new run from "
        "its weights with model.init_from"
    )


def test_a_checkpoint_whose_weights_do_not_fit_is_one_line_naming_the_tensor(tiny_shapes, tiny_checkpoint, tmp_path):
    """A checkpoint of an earlier version records no settings: its weights are still checked."""
    from captioning.errors import CheckpointError

    old = torch.load(tiny_checkpoint, map_location="cpu", weights_only=True)
    old.pop("continuation", None)
    path = tmp_path / "old.ckpt"
    torch.save(old, path)
    with pytest.raises(CheckpointError) as refused:
        fit_from(tiny_shapes, tmp_path, path, ["--model.decoder.hidden_dim", "64"])
    err = str(refused.value)
    assert len(err.splitlines()) == 1 and err.startswith(
        f"{path}: its weights do not fit this config's model (model.decoder."
    )
    assert "is [" in err and "in the file, the model needs [" in err


def test_the_same_settings_resume_and_testing_a_checkpoint_with_another_batch_size_is_fine(
    tiny_shapes, tiny_checkpoint, tmp_path
):
    cli = run_lightning_cli(
        fit_args(
            tiny_shapes, tmp_path, steps=3, extra=["--trainer.max_epochs", "2", "--ckpt_path", str(tiny_checkpoint)]
        )
    )
    assert cli.trainer.global_step == 6
    args = fit_args(
        tiny_shapes, tmp_path / "test", extra=["--data.batch_size", "4", "--ckpt_path", str(tiny_checkpoint)]
    )
    assert main(["test", *args[1:]]) == 0


def test_continuation_names_the_number_of_processes():
    from captioning.training.resume import continuation_difference

    assert (
        continuation_difference({"world_size": 2, "seed": 0}, {"world_size": 1, "seed": 0})
        == "the number of processes (trainer.devices x trainer.num_nodes) is 2 in the checkpoint, 1 here"
    )
    assert (
        continuation_difference({"batch_size": 8}, {"batch_size": 8, "world_size": 4}) is None
    )  # not recorded: not compared


def loader(batch_size=4, seed=0, size=20):
    from captioning.data.sampling import ResumableLoader

    return ResumableLoader(list(range(size)), batch_size, seed=seed)


def test_the_loader_counts_its_position_in_samples_and_refuses_another_order():
    first = loader()
    served = iter(first)
    seen = [next(served).tolist() for _ in range(2)]
    state = first.state_dict()
    assert state["samples"] == 8 and state["batch_size"] == 4 and state["seed"] == 0
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [b.tolist() for b in resumed]
    assert sorted(sum(seen + rest, [])) == list(range(20))  # the epoch continues: each sample once
    for other in (loader(batch_size=5), loader(seed=1)):
        with pytest.raises(ConfigError, match="is 4 in the checkpoint, 5 here|is 0 in the checkpoint, 1 here"):
            other.load_state_dict(state)


def test_a_position_saved_at_the_end_of_an_epoch_does_not_cut_the_next_epoch():
    """A checkpoint written after the epoch's last batch (at its validation) resumes into a whole next epoch."""
    first = loader()
    assert len(list(first)) == 5
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    resumed.sampler.set_epoch(1)  # Lightning starts the next epoch
    assert len(list(resumed)) == 5


# ---------------------------------------------------------------------- --ckpt_path last
def test_ckpt_path_last_stays_in_the_run_s_version_folders(tiny_shapes, tmp_path, capsys):
    logged = ["--trainer.logger", "true"]
    run_lightning_cli(fit_args(tiny_shapes, tmp_path, steps=2, extra=logged))
    mine = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert mine.is_file()
    (tmp_path / "lightning_logs" / "version_1" / "checkpoints").mkdir(parents=True)  # a newer run without one
    decoy = tmp_path / "someone_else" / "run" / "last.ckpt"  # newer, but not in this run's layout
    decoy.parent.mkdir(parents=True)
    decoy.write_bytes(b"not this one")
    capsys.readouterr()
    cli = run_lightning_cli(
        fit_args(tiny_shapes, tmp_path, steps=2, extra=[*logged, "--ckpt_path", "last", "--trainer.max_epochs", "2"])
    )
    assert f"resuming from {mine}" in capsys.readouterr().out
    assert cli.trainer.global_step == 4


def test_ckpt_path_last_without_a_logger_is_the_root_s_checkpoints_folder(tiny_shapes, tmp_path, capsys):
    decoy = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    decoy.parent.mkdir(parents=True)
    decoy.write_bytes(b"not this one")
    err = one_line_error(capsys, fit_args(tiny_shapes, tmp_path, steps=2, extra=["--ckpt_path", "last"]))
    assert f"--ckpt_path last: no last.ckpt under {tmp_path}" in err and str(tmp_path / "checkpoints") in err


# ---------------------------------------------------------------------- durable checkpoints
def test_checkpoints_are_fsynced_before_and_after_their_rename(tiny_shapes, tmp_path, monkeypatch):
    import stat

    synced = []
    real_fsync = os.fsync

    def recording(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, steps=2))
    folder = Path(cli.trainer.checkpoint_callback.dirpath)
    written = sorted(p.name for p in folder.iterdir())
    assert "last.ckpt" in written and not [n for n in written if n.endswith(".tmp")]
    assert synced.count("file") >= 2 and synced.count("folder") >= 2  # the best and the last checkpoint
    for name in written:
        assert torch.load(folder / name, map_location="cpu", weights_only=True)["global_step"] == 2


# ---------------------------------------------------------------------- SIGTERM in a real run
SLOW_VALIDATION = '''
import time
from lightning.pytorch.callbacks import Callback


class SlowValidation(Callback):
    """Says when a validation batch (not the sanity check's) begins, and makes it take ``seconds``."""

    def __init__(self, seconds: float = 1.0):
        self.seconds = seconds

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            print(f"validating step {trainer.global_step} batch {batch_idx}", flush=True)
            time.sleep(self.seconds)
'''


def sigterm_args(annotations, root, seconds=None, extra=()):
    slow = ["--trainer.callbacks+=slow_validation.SlowValidation", "--trainer.callbacks.seconds", str(seconds)]
    return fit_args(
        annotations,
        root,
        steps=2,
        extra=[
            "--trainer.max_epochs",
            "2",
            "--trainer.limit_val_batches",
            "8",
            "--data.eval_batch_size",
            "1",
            "--trainer.num_sanity_val_steps",
            "0",
            "--trainer.deterministic",
            "true",
            "--trainer.enable_progress_bar",
            "true",
            *(slow if seconds is not None else []),
            *extra,
        ],
    )


def start(tmp_path, argv):
    (tmp_path / "slow_validation.py").write_text(SLOW_VALIDATION)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    return subprocess.Popen(
        [sys.executable, "-m", "captioning.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for(proc, text: str, timeout: float = 120) -> list[str]:
    """The lines the run prints before the first that starts with ``text``."""
    deadline, seen = time.time() + timeout, []
    for line in proc.stdout:
        if line.startswith(text):
            return seen
        seen.append(line)
        assert time.time() < deadline, f"no {text!r} line"
    pytest.fail(f"the run ended before {text!r}: {proc.stderr.read()[-2000:]}")


@pytest.mark.slow
def test_sigterm_during_validation_stops_within_seconds_and_the_resumed_run_redoes_that_validation(
    tiny_shapes, tmp_path, capsys
):
    run = start(tmp_path, sigterm_args(tiny_shapes, tmp_path / "stopped", seconds=1.0))
    wait_for(run, "validating step 2 batch 1")  # the first epoch's validation, 8 batches of a second each
    run.send_signal(signal.SIGTERM)
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    before = wait_for(run, f"SIGTERM: stopped after step 2; wrote {last}")
    # stopped inside the validation: its last batches never began, and it never ended
    assert not [line for line in before if line.startswith(("validating step 2 batch 7", "validation after"))], before
    out, err = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert safe_torch_load(last)["global_step"] == 2

    capsys.readouterr()
    resumed = run_lightning_cli(sigterm_args(tiny_shapes, tmp_path / "stopped", extra=["--ckpt_path", str(last)]))
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("validation after step 2:") for line in lines) == 1  # done again, whole
    whole = run_lightning_cli(sigterm_args(tiny_shapes, tmp_path / "whole"))
    assert resumed.trainer.global_step == whole.trainer.global_step == 4
    for key in ("val/CIDEr", "val/BLEU-4"):
        assert float(resumed.trainer.callback_metrics[key]) == float(whole.trainer.callback_metrics[key])
    for k, v in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k
    best = [str(p.name) for p in (tmp_path / "stopped" / "checkpoints").glob("best-*.ckpt")]
    assert sorted(best) == sorted(p.name for p in (tmp_path / "whole" / "checkpoints").glob("best-*.ckpt"))


@pytest.mark.slow
def test_a_second_sigterm_exits_at_once(tiny_shapes, tmp_path):
    run = start(tmp_path, sigterm_args(tiny_shapes, tmp_path, seconds=60.0))  # a batch that would take 60 s
    wait_for(run, "validating step 2 batch 0")
    run.send_signal(signal.SIGTERM)
    deadline = time.time() + 60  # the first one handled (it says so) before the second is sent
    for line in run.stderr:
        if "SIGTERM: stopping at the end of the current batch" in line or time.time() > deadline:
            break
    sent = time.time()
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert time.time() - sent < 30, "waited for the batch"  # (it had most of 60 s to go)
    assert run.returncode == 128 + signal.SIGTERM
    assert "SIGTERM again: exiting at once" in err


# ---------------------------------------------------------------------- DDP: the ranks agree
DDP_SCRIPT = r'''
import os, signal, sys, time
from lightning.pytorch.callbacks import Callback
from captioning.training.cli import run_lightning_cli

out_dir, annotations, case = sys.argv[1], sys.argv[2], sys.argv[3]
rank = int(os.environ.get("LOCAL_RANK", 0))
if case == "clocks" and rank == 0:  # rank 0's clock says 10 minutes have passed at every look; rank 1's never
    real, calls = time.monotonic, [0]

    def fast():
        calls[0] += 1
        return real() + 601 * calls[0]

    time.monotonic = fast


class SignalRank1(Callback):
    """Rank 1 (only) receives SIGTERM in the middle of step 3."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if case == "sigterm" and trainer.global_rank == 1 and trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)


args = ["--config", "configs/shapes_soft.yaml", "--data.annotations", annotations, "--data.batch_size", "4",
        "--data.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
        "--trainer.max_epochs", "1", "--trainer.max_time", "null", "--trainer.limit_val_batches", "1",
        "--trainer.num_sanity_val_steps", "0", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", out_dir,
        "--model.val_generation.max_new_tokens", "4"]
cli = run_lightning_cli(args, run=False)
cli.trainer.callbacks.append(SignalRank1())
cli.trainer.fit(cli.model, datamodule=cli.datamodule)
print(f"rank {rank} finished at step {cli.trainer.global_step}", flush=True)
'''


def run_ddp(tmp: Path, annotations, case: str, timeout: float = 150) -> subprocess.CompletedProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    script = tmp / "run.py"
    script.write_text(DDP_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    for var in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp), str(annotations), case],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the ranks wait for each other: the whole process group
        proc.communicate()
        pytest.fail(f"the DDP run ({case}) hung")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def ddp_data(tmp_path_factory):
    from captioning.data.shapes import generate

    return generate(
        tmp_path_factory.mktemp("ddp_data"), n_train=8, n_val=2, n_test=2, seed=5, image_size=64, progress=False
    )


@pytest.mark.slow
def test_ddp_ranks_save_the_periodic_checkpoint_together_by_rank_0_s_clock(ddp_data, tmp_path):
    done = run_ddp(tmp_path, ddp_data, "clocks")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 finished at step 5" in done.stdout  # 40 pairs, 2 ranks, batches of 4
    assert safe_torch_load(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 5


@pytest.mark.slow
def test_ddp_sigterm_on_one_rank_stops_every_rank_at_the_same_step_with_a_checkpoint(ddp_data, tmp_path):
    done = run_ddp(tmp_path, ddp_data, "sigterm")
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert f"SIGTERM: stopped after step 3; wrote {last}" in done.stdout
    assert "finished" not in done.stdout
    assert safe_torch_load(last)["global_step"] == 3


# ---------------------------------------------------------------------- --ckpt_path through the project's loader
class RunsCode:
    """Unpickling this calls os.system (a checkpoint that would run code)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("command", ["fit", "validate"])
def test_a_code_running_ckpt_path_is_refused_in_one_line_with_nothing_run(
    command, tiny_shapes, tiny_checkpoint, tmp_path, capsys
):
    marker = tmp_path / "pwned"
    ckpt = safe_torch_load(tiny_checkpoint)
    ckpt["hyper_parameters"]["payload"] = RunsCode(marker)
    evil = tmp_path / "evil.ckpt"
    torch.save(ckpt, evil)
    argv = fit_args(
        tiny_shapes, tmp_path / "run", steps=2, extra=["--trainer.max_epochs", "2", "--ckpt_path", str(evil)]
    )
    err = one_line_error(capsys, [command, *argv[1:]])
    assert "evil.ckpt: refused to load: not a plain-weights checkpoint" in err
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # Lightning's reader of a URL's file would have run it
    assert marker.exists()


def test_a_code_running_ckpt_path_is_refused_whatever_the_checkpoint_plugin(
    tiny_shapes, tiny_checkpoint, tmp_path, capsys
):
    """A config's own CheckpointIO would read the file its way: the project's loader reads it first."""
    marker = tmp_path / "pwned"
    ckpt = safe_torch_load(tiny_checkpoint)
    ckpt["hyper_parameters"]["payload"] = RunsCode(marker)
    evil = tmp_path / "evil.ckpt"
    torch.save(ckpt, evil)
    err = one_line_error(
        capsys,
        fit_args(
            tiny_shapes,
            tmp_path / "run",
            steps=2,
            extra=[
                "--trainer.max_epochs",
                "2",
                "--trainer.plugins",
                "lightning.fabric.plugins.TorchCheckpointIO",
                "--ckpt_path",
                str(evil),
            ],
        ),
    )
    assert "evil.ckpt: refused to load" in err and not marker.exists()


@pytest.mark.parametrize(
    "url", ["https://example.com/last.ckpt", "http://127.0.0.1:9/last.ckpt", "s3://bucket/last.ckpt"]
)
def test_a_ckpt_path_url_is_refused_in_one_line(url, tiny_shapes, tmp_path, capsys):
    err = one_line_error(capsys, fit_args(tiny_shapes, tmp_path, steps=2, extra=["--ckpt_path", url]))
    assert f"{url}: refused: a checkpoint to resume from is a local file" in err


def test_the_checkpoint_plugin_reads_with_the_project_s_loader(tiny_checkpoint, tmp_path):
    from captioning.errors import CheckpointError
    from captioning.training.checkpoint_io import DurableCheckpointIO

    io = DurableCheckpointIO()
    assert io.load_checkpoint(tiny_checkpoint)["global_step"] == safe_torch_load(tiny_checkpoint)["global_step"]
    legacy = tmp_path / "legacy.ckpt"
    torch.save({"state_dict": {}}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="legacy pickle"):
        io.load_checkpoint(legacy)
    with pytest.raises(CheckpointError, match="refused: a checkpoint to resume from is a local file"):
        io.load_checkpoint("https://example.com/x.ckpt")
