"""PyTorch's threads on a shared machine (common.py: the free cores, --threads, OMP_NUM_THREADS;
training/pace.py: following the load while training, and the time a step budget takes)."""

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from captioning import common
from captioning.common import CpuSample, choose_threads, fixed_threads, threads_for, usable_cores


@pytest.fixture
def keep_threads():
    """Restore torch's threads after a test that changes them."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def sample(busy, total, own, wall):
    s = CpuSample.__new__(CpuSample)
    s.busy, s.total, s.own, s.wall = busy, total, own, wall
    return s


def test_threads_follow_the_free_cores():
    assert threads_for(2, 0.05) == 2  # a quiet machine: every core
    assert threads_for(2, 1.0) == 1  # one core taken by another program: one thread
    assert threads_for(2, 0.3) == 1  # a core counts as free when 3/4 of it is idle
    assert threads_for(2, 2.0) == 1 and threads_for(1, 5.0) == 1  # never fewer than one
    assert threads_for(16, 4.0) == 12 and threads_for(16, 4.0, processes=4) == 3  # shared among DDP's processes
    assert threads_for(8, None) == 8  # others' use unknown (not Linux): every core


def test_others_busy_is_the_machines_use_less_this_processs():
    # 2 cores for 1 s of wall clock: 100 ticks each; 150 of the 200 busy, this process used 0.5 s of CPU
    earlier, later = sample(1000, 4000, 10.0, 50.0), sample(1150, 4200, 10.5, 51.0)
    assert later.others_busy(earlier, 2) == pytest.approx(1.5 - 0.5)
    assert sample(1010, 4200, 99.0, 51.0).others_busy(earlier, 2) == 0.0  # never below zero
    assert later.others_busy(sample(0, 0, 0.0, 0.0), 2) is None  # no /proc/stat: unknown


@pytest.mark.skipif(not CpuSample().available, reason="reads /proc/stat (Linux)")
def test_a_busy_process_beside_takes_a_core():
    """A CPU-bound child counts as another process's use: at least most of a core over a second
    (whatever else the machine runs adds to it)."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it start
        first = CpuSample()
        time.sleep(1.0)
        others = CpuSample().others_busy(first, usable_cores())
    finally:
        child.kill()
        child.wait()
    assert others >= 0.6 * min(1, usable_cores())


def test_the_users_choice_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert fixed_threads(None) == 3 and fixed_threads(5) == 5
    assert choose_threads(5) == (5, "--threads", False)
    assert choose_threads(None) == (3, "OMP_NUM_THREADS=3", False)
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(common, "free_core_threads", lambda interval=0.3, processes=1: (1, "busy"))
    assert fixed_threads(None) is None and choose_threads(None) == (1, "busy", True)


def test_fit_takes_threads_from_the_flag(tiny_shapes, tmp_path, keep_threads, capsys):
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    torch.set_num_threads(2)
    run_lightning_cli(fit_args(tiny_shapes, tmp_path, steps=1, extra=["--threads", "1"]))
    assert torch.get_num_threads() == 1
    with pytest.raises(SystemExit):
        run_lightning_cli(fit_args(tiny_shapes, tmp_path, steps=1, extra=["--threads", "0"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: threads: Not of type PositiveInt: does not conform to restriction v>0 (Given value: 0)"


def test_the_watch_follows_the_load_and_says_each_change(monkeypatch, keep_threads, capsys):
    """Started beside a busy program, training takes one thread; when the program ends, every core."""
    from captioning.training import pace

    monkeypatch.setattr(pace, "usable_cores", lambda: 2)
    monkeypatch.setattr(pace, "free_core_threads", lambda processes=1: (1, "other processes use 1.0 of 2 cores"))
    torch.set_num_threads(2)
    trainer = SimpleNamespace(num_devices=1, is_global_zero=True)
    watch = pace.ThreadWatch(every=0.0)
    watch.setup(trainer, None, "fit")
    assert torch.get_num_threads() == 1
    assert capsys.readouterr().out == "threads: 2 -> 1 (other processes use 1.0 of 2 cores; --threads N to choose)\n"

    quiet = iter([sample(0, 1000, 0.0, 0.0), sample(10, 2000, 0.0, 5.0)])  # then nobody else is busy
    monkeypatch.setattr(pace, "CpuSample", lambda: next(quiet))
    watch._last = next(quiet)
    watch.on_train_batch_end(trainer, None, None, None, 0)
    assert torch.get_num_threads() == 2
    assert capsys.readouterr().out == "threads: 1 -> 2 (other processes use 0.0 of 2 cores; --threads N to choose)\n"


def test_the_pace_of_a_step_budget_is_said_once(monkeypatch, capsys):
    from captioning.training import pace

    clock = iter(range(0, 1000, 2))  # 2 s a step
    monkeypatch.setattr(pace.time, "monotonic", lambda: next(clock))
    trainer = SimpleNamespace(max_steps=1200, global_step=0, is_global_zero=True)
    note = pace.PaceNote(after=10)
    note.on_train_start(trainer, None)
    for step in range(1, 30):
        trainer.global_step = step
        note.on_train_batch_end(trainer, None, None, None, step)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("pace: 0.50 steps/s with ")
    assert out[0].endswith("the 1,200 steps take about 40 min more (validations besides)")  # 1,189 steps left
    assert pace.minutes(40) == "40 s" and pace.minutes(7500) == "2 h 05 min"
