"""Definitions every layer shares: the path type, the default device, the attention grid's shape and
the choice of PyTorch's threads on a shared machine."""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a device is made: the ONNX route runs without it
    import torch

PathLike = str | os.PathLike[str]


def grid_shape(num_locations: int) -> tuple[int, int]:
    """(gh, gw) of L locations: a square grid when L is a square (every encoder here), else one row.

    Encoders flatten their grid row-major: location l is cell (l // gw, l % gw)."""
    side = math.isqrt(num_locations)
    return (side, side) if side * side == num_locations else (1, num_locations)


def default_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` if given (checked: a one-line ConfigError if it is not one, or is not here), else
    CUDA when a GPU is visible, else the CPU."""
    import torch

    from captioning.errors import ConfigError

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {device}: not a device (expected cpu, cuda or cuda:N)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--device {device}: no CUDA GPU is available here; use --device cpu")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"--device {device}: there are {count} CUDA GPU(s) (cuda:0 to cuda:{count - 1})")
    elif device.type not in ("cpu", "mps"):
        raise ConfigError(f"--device {device}: expected cpu or cuda")
    return device


# --------------------------------------------------------------------------- threads on a shared machine
# PyTorch's intra-op threads default to one a core; on a machine where other processes keep cores
# busy, those threads wait on one another and a step takes several times as long as with one thread
# (measured: docs/PERFORMANCE.md, "Threads"). The commands that compute choose their threads from the cores
# that are free, unless told (--threads N, or OMP_NUM_THREADS).

#: a core counts as free when at least this share of it is idle
FREE_SHARE = 0.75
#: the environment variable that, when set, fixes the threads as PyTorch reads it
THREADS_ENV = "OMP_NUM_THREADS"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (containers)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:  # cgroup v2: "max 100000" or "200000 100000"
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


class CpuSample:
    """The busy and total time of this process's cores since boot (/proc/stat, Linux), this
    process's own CPU time and the wall clock, at one moment: two samples give the cores that
    other processes kept busy between them (:meth:`others_busy`)."""

    def __init__(self):
        self.busy, self.total = _proc_stat_times()
        times = os.times()
        self.own = times.user + times.system  # every thread of this process
        self.wall = time.monotonic()

    @property
    def available(self) -> bool:
        """Whether the system's CPU times could be read (Linux)."""
        return self.total > 0

    def others_busy(self, earlier: CpuSample, cores: int) -> float | None:
        """The cores that other processes kept busy since ``earlier`` (None where unknown): the
        busy share of this process's cores times ``cores``, less this process's own use."""
        if not (self.available and earlier.available) or self.total <= earlier.total or self.wall <= earlier.wall:
            return None
        busy = (self.busy - earlier.busy) / (self.total - earlier.total) * cores
        own = (self.own - earlier.own) / (self.wall - earlier.wall)
        return min(float(cores), max(0.0, busy - own))


def _proc_stat_times() -> tuple[int, int]:
    """(busy, total) clock ticks since boot of the CPUs this process may run on, from /proc/stat;
    (0, 0) where there is none."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy = total = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if not name[3:].isdigit():
                    break
                if allowed is not None and int(name[3:]) not in allowed:
                    continue
                # user nice system idle iowait irq softirq steal (guest time is inside user's)
                ticks = [int(x) for x in fields[:8]]
                idle = ticks[3] + ticks[4]
                busy += sum(ticks) - idle
                total += sum(ticks)
    except (OSError, ValueError, IndexError):
        return 0, 0
    return busy, total


def threads_for(cores: int, others_busy: float | None, processes: int = 1) -> int:
    """The intra-op threads for one of ``processes`` processes on ``cores`` cores of which others
    keep ``others_busy`` busy: the free cores (a core is free when :data:`FREE_SHARE` of it is
    idle) shared among the processes, at least one; every core's share when ``others_busy`` is None."""
    free = cores if others_busy is None else math.floor(cores - others_busy + (1 - FREE_SHARE))
    return max(1, min(cores, free) // max(1, processes))


def free_core_threads(interval: float = 0.3, processes: int = 1) -> tuple[int, str]:
    """(threads, why) from the cores that other processes keep busy over ``interval`` seconds."""
    cores = usable_cores()
    first = CpuSample()
    if not first.available:
        return threads_for(cores, None, processes), f"{cores} core(s); others' use unknown here"
    time.sleep(interval)
    others = CpuSample().others_busy(first, cores)
    return threads_for(cores, others, processes), describe_load(cores, others)


def describe_load(cores: int, others_busy: float | None) -> str:
    """ "other processes use 1.0 of 2 cores", for the lines that report a choice of threads."""
    return f"{cores} core(s)" if others_busy is None else f"other processes use {others_busy:.1f} of {cores} cores"


def fixed_threads(requested: int | None = None) -> int | None:
    """The threads the user fixed: ``requested`` (``--threads N``), else :data:`THREADS_ENV`'s
    value when set to a positive number; None: choose from the machine's load."""
    if requested is not None:
        return int(requested)
    env = os.environ.get(THREADS_ENV, "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else None


def choose_threads(requested: int | None = None, processes: int = 1) -> tuple[int, str, bool]:
    """(threads, why, automatic): ``requested`` when given (``--threads N``), else what
    :data:`THREADS_ENV` says when set, else :func:`free_core_threads`; ``automatic`` is whether the
    choice came from the machine's load (and should follow it while the work runs)."""
    fixed = fixed_threads(requested)
    if fixed is not None:
        return fixed, "--threads" if requested is not None else f"{THREADS_ENV}={fixed}", False
    threads, why = free_core_threads(processes=processes)
    return threads, why, True


def use_threads(requested: int | None = None, processes: int = 1) -> tuple[int, str]:
    """Set PyTorch's intra-op threads by :func:`choose_threads`; (threads, why)."""
    import torch

    threads, why, _ = choose_threads(requested, processes)
    torch.set_num_threads(threads)
    return threads, why


# --------------------------------------------------------------------------- "did you mean"
def nearest(word: str, candidates, cutoff: float = 0.6) -> str | None:
    """The candidate most like ``word`` (difflib's ratio of at least ``cutoff``), for "did you mean"
    in the errors of a misspelt flag, key or name; None when none is close. A dotted key
    (``--model.decoder.hiden_dim``) is compared by its last part among the keys of its group, when
    the group exists, so that a long shared prefix does not make every key of the group look near."""
    import difflib

    candidates = list(dict.fromkeys(candidates))
    group, dot, last = word.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in candidates if dot and c.rpartition(".")[0] == group}
    if siblings:
        found = difflib.get_close_matches(last, list(siblings), n=1, cutoff=cutoff)
        return siblings[found[0]] if found else None
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(words, candidates, cutoff: float = 0.6) -> str:
    """ "; did you mean --num-beams?" for the misspelt ``words`` that have a near candidate ("" when
    none has); with several, each named: "; did you mean --a (for --x), --b (for --y)?"."""
    pairs = [(w, nearest(w, candidates, cutoff)) for w in dict.fromkeys(words)]
    pairs = [(w, m) for w, m in pairs if m is not None and m != w]
    if not pairs:
        return ""
    if len(pairs) == 1:
        return f"; did you mean {pairs[0][1]}?"
    return "; did you mean " + ", ".join(f"{m} (for {w})" for w, m in pairs) + "?"
