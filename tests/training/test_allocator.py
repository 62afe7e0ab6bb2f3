"""The training process keeps the memory a step frees for the next step (training/allocator.py): glibc's
mmap and trim thresholds are raised, so that a block of several MB comes from the heap and stays there
once freed; not where the user tunes malloc. (The page faults and time that saves:
tools/benchmarks/allocator.py.)"""

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from captioning.training.allocator import MMAP_THRESHOLD, user_tunes_malloc
from tests.helpers import fit_args

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux)")

# The child allocates one block of 8 MB (above glibc's first mmap threshold of 128 KB, below the
# 32 MB it is raised to), frees it, and prints what mallinfo2 says of the heap and the mapped blocks.
BLOCK = 8 << 20
CHILD = f"""
import ctypes, ctypes.util, json, sys
from captioning.training.allocator import keep_freed_memory
done = keep_freed_memory() if sys.argv[1] == "keep" else None
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
before = libc.mallinfo2()
block = libc.malloc({BLOCK})
ctypes.memset(block, 1, {BLOCK})
held = libc.mallinfo2()
libc.free(block)
after = libc.mallinfo2()
print(json.dumps({{"set": done, "mapped": held.hblkhd - before.hblkhd, "heap": held.arena - before.arena,
                  "heap_after_free": after.arena - before.arena}}))
"""


def child(mode: str, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GLIBC_TUNABLES", "MALLOC_"))}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env={**environ, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def mallinfo2() -> bool:
    """Whether this C library is a glibc with mallinfo2 (2.33 and later)."""
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not mallinfo2(), reason="glibc 2.33 or later (mallinfo2)")
def test_a_freed_block_of_several_mb_stays_in_the_heap():
    assert BLOCK < MMAP_THRESHOLD
    plain, kept = child("plain"), child("keep")
    assert plain["set"] is None and kept["set"] is True
    # glibc as it comes maps the block afresh (and would unmap it when freed)
    assert plain["mapped"] >= BLOCK, plain
    # kept: the block comes from the heap, and the heap keeps it once freed (the trim threshold is far up)
    assert kept["mapped"] == 0 and kept["heap"] >= BLOCK and kept["heap_after_free"] >= BLOCK, kept


def test_a_users_own_malloc_settings_are_left_alone():
    assert child("keep", GLIBC_TUNABLES="glibc.malloc.trim_threshold=0")["set"] is False
    assert child("keep", MALLOC_MMAP_THRESHOLD_="65536")["set"] is False
    assert user_tunes_malloc({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1"})
    assert not user_tunes_malloc({"GLIBC_TUNABLES": "glibc.rtld.nns=2"})
    assert not user_tunes_malloc({})


def test_training_sets_it(tiny_shapes, tmp_path):
    """`captioning fit` (and the demo, which trains through it) keeps the freed memory: run in a
    fresh process, where nothing has set it before."""
    code = (
        "import sys; from captioning.training.allocator import keep_freed_memory as keep; "
        "from captioning.training.cli import run_lightning_cli; assert keep.cache_info().currsize == 0; "
        "run_lightning_cli(sys.argv[1:], run=False); assert keep.cache_info().currsize == 1; print(keep())"
    )
    args = fit_args(tiny_shapes, tmp_path)[1:]  # the arguments without the subcommand (run=False)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GLIBC_TUNABLES", "MALLOC_"))}
    out = subprocess.run([sys.executable, "-c", code, *args], env=environ, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
