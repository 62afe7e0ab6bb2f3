"""Stopping a training run on request, on one process or under DDP.

* :class:`StopSignals`: the first SIGINT (Ctrl-C) or SIGTERM (a scheduler's) asks the run to stop;
  the run acts on it at its next training or validation batch. A second one exits at once
  (status 128 + the signal's number, saying so on standard error).
* :func:`agree`: under DDP, every rank takes the same decisions at the same batch (whether to stop,
  and whether a periodic checkpoint is due, which rank 0's clock decides), so that all of them enter
  a checkpoint's save, and its barrier, together. One small all-reduce on the CPU per batch.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import torch

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """SIGINT and SIGTERM handlers of a training process (main thread only; elsewhere nothing is
    installed). ``requested`` is the number of the first signal received, None before one.

    Args:
        on_second: called before exiting on a second signal (e.g. to kill the other DDP ranks).
    """

    def __init__(self, on_second: Callable[[], None] | None = None):
        self.requested: int | None = None
        self.on_second = on_second
        self._previous: dict = {}

    def install(self) -> None:
        self.requested = None
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def keep_in_front(self) -> None:
        """Install the handlers again if something replaced them (Lightning installs its own SIGTERM
        handler when its loop starts)."""
        if self._previous and signal.getsignal(signal.SIGTERM) != self._handle:
            for sig in SIGNALS:
                signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            os.write(2, f"\n{name} again: exiting at once, without writing a checkpoint\n".encode())
            if self.on_second is not None:
                self.on_second()
            os._exit(128 + signum)
        self.requested = signum
        os.write(2, f"\n{name}: stopping at the end of the current batch (again to exit at once)\n".encode())


def cpu_group(trainer):
    """The process group :func:`agree` reduces over: None (the default group) on one process or when
    the default group takes CPU tensors (gloo); else a gloo group over the same ranks, made once by
    every rank, so that agreeing never waits for the GPU's queue."""
    import torch.distributed as dist

    if trainer.world_size == 1 or not dist.is_available() or not dist.is_initialized():
        return None
    return None if "gloo" in str(dist.get_backend()) else dist.new_group(backend="gloo")


def agree(trainer, group, signum: int | None, due: bool) -> tuple[int | None, bool]:
    """(the signal any rank received (the largest number), rank 0's ``due``): the same on every rank.

    Called by every rank at the same point (each batch); on one process, the arguments as they are."""
    if trainer.world_size == 1:
        return signum, due
    import torch.distributed as dist

    flags = torch.tensor([signum or 0, int(bool(due) and trainer.is_global_zero)], dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    return (int(flags[0]) or None), bool(flags[1])


def validation_not_begun(progress: dict) -> dict:
    """The validation loop's progress in a checkpoint (Lightning's ``batch_progress`` state) rewritten
    as "interrupted in its first batch": the resumed run does the whole validation again, from its
    first batch (Lightning restarts an evaluation interrupted mid-way; one that had ended a batch it
    would skip). The weights, optimizer and training position are those at the validation's start."""
    total, current = progress["total"], progress["current"]
    before = total["completed"] - current["completed"]  # batches of earlier validations
    return {
        **progress,
        "is_last_batch": False,
        "total": {"ready": before + 1, "started": before + 1, "processed": before, "completed": before},
        "current": {"ready": 1, "started": 1, "processed": 0, "completed": 0},
    }
