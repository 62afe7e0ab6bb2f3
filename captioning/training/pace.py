"""How fast a run goes on this machine: PyTorch's threads following the machine's load
(common.py: ``choose_threads``), and the time a step budget will take.

:class:`ThreadWatch` chooses the intra-op threads when the run starts, from the cores other
processes leave free. It checks again every ``every`` seconds from the CPU time the machine and
the run used since the last check (no extra waiting): a run started on a quiet machine drops to
fewer threads when another process takes cores, and takes them back when it ends. It is added
when neither ``--threads N`` nor OMP_NUM_THREADS fixes the threads (training/cli.py).
:class:`PaceNote` says, early in a run with ``trainer.max_steps``, how long the steps will take.
"""

from __future__ import annotations

import time

import torch
from lightning.pytorch.callbacks import Callback

from captioning.common import CpuSample, describe_load, free_core_threads, threads_for, usable_cores


class ThreadWatch(Callback):
    """Sets ``torch.set_num_threads`` from the free cores at the start and every ``every`` seconds
    (one line when the number changes)."""

    def __init__(self, every: float = 30.0):
        self.every = every
        self.processes = 1  # the run's processes on this machine (DDP's), set at setup
        self._last: CpuSample | None = None
        self._due = 0.0

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.processes = max(1, int(getattr(trainer, "num_devices", 1) or 1))
        self._set(trainer, *free_core_threads(processes=self.processes))
        self._last, self._due = CpuSample(), time.monotonic() + self.every

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._last is None or time.monotonic() < self._due:
            return
        now, cores = CpuSample(), usable_cores()
        others = now.others_busy(self._last, cores)
        self._last, self._due = now, time.monotonic() + self.every
        if others is not None:
            self._set(trainer, threads_for(cores, others, self.processes), describe_load(cores, others))

    def _set(self, trainer, threads: int, why: str) -> None:
        """Use ``threads``; one line when that changes the number."""
        before = torch.get_num_threads()
        if threads == before:
            return
        torch.set_num_threads(threads)
        if trainer.is_global_zero:
            print(f"threads: {before} -> {threads} ({why}; --threads N to choose)", flush=True)


class PaceNote(Callback):
    """One line, ``after`` training steps into a run with a step budget (``trainer.max_steps``): the
    steps per second this machine gives and the time the budget will take at that pace."""

    def __init__(self, after: int = 50):
        self.after = after
        self._start: tuple[int, float] | None = None
        self._said = False

    def on_train_start(self, trainer, pl_module) -> None:
        self._start, self._said = None, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._said or not trainer.max_steps or trainer.max_steps < 0:
            return
        if self._start is None:  # from the end of the first step: it pays for one-off work (caches, warm-up)
            self._start = (trainer.global_step, time.monotonic())
            return
        steps, seconds = trainer.global_step - self._start[0], time.monotonic() - self._start[1]
        if steps < self.after or seconds <= 0:
            return
        self._said = True
        rate, left = steps / seconds, max(0, trainer.max_steps - trainer.global_step)
        if trainer.is_global_zero:
            print(
                f"pace: {rate:.2f} steps/s with {torch.get_num_threads()} thread(s): the {trainer.max_steps:,} steps "
                f"take about {minutes(left / rate)} more (validations besides)",
                flush=True,
            )


def minutes(seconds: float) -> str:
    """ "40 s", "6 min", "2 h 05 min": a duration as a person reads it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
