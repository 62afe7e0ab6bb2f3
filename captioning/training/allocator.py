"""Keep the memory a training step frees for the next step (Linux, glibc's malloc).

A CPU training step allocates and frees the same large tensors at every step: activations and
their gradients of several MB each. glibc's malloc serves blocks above its mmap threshold (128 KB
at first, moved up as such blocks are freed, to at most 32 MB) with fresh mappings from the kernel.
It gives the top of its heap back to the kernel once more than its trim threshold (128 KB) is free
there. Either way the next step's tensors of the same size are mapped afresh and every page of
them is faulted in again. :func:`keep_freed_memory` sets the mmap threshold to its largest value
(32 MB) and the trim threshold far above any step's memory, so that freed blocks stay in the
process and the next step reuses them: the process keeps its peak heap instead of shrinking
between steps, and a step's tensors are not faulted in again. The numbers computed are the same.
The page faults and step times it saves are measured in docs/RECIPES.md ("Where the demo's time
goes") and docs/PERFORMANCE.md.

Nothing is changed where the user set glibc's malloc tunables (``GLIBC_TUNABLES`` with a
``glibc.malloc`` setting, or the ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
variables), off Linux, or with another C library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: free memory at the top of the heap kept rather than given back: mallopt's largest value (2 GB),
#: far above a step's needs
TRIM_THRESHOLD = 2**31 - 1


def user_tunes_malloc(environ=os.environ) -> bool:
    """Whether the environment sets glibc's malloc tunables itself."""
    return "glibc.malloc" in environ.get("GLIBC_TUNABLES", "") or any(
        name in environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    )


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds as the module says, once per process (later calls return
    the first call's answer). Returns whether they are set (False off Linux, without glibc, or where
    the user tunes malloc)."""
    if not sys.platform.startswith("linux") or user_tunes_malloc():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc only (musl has no mallopt thresholds)
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
