"""The training process keeps the memory a step frees for the next step (training/allocator.py):
a training step's tensors are not faulted in afresh at every step."""

import json
import os
import subprocess
import sys

import pytest

from captioning.training.allocator import user_tunes_malloc
from tests.helpers import fit_args

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux)")

# The demo's training step (its CNN and decoder sizes, 96 captions of 64 px images): the child prints
# the minor page faults of each of nine steps after two (the first steps fault the heap in, either way).
CHILD = """
import json, resource, sys, torch
from captioning.training.allocator import keep_freed_memory
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.models.show_attend_tell import ShowAttendTell
from captioning.vocab import Vocabulary
done = keep_freed_memory() if sys.argv[1] == "keep" else None
torch.set_num_threads(1)
torch.manual_seed(0)
vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(26)])
model = ShowAttendTell(EncoderConfig("small_cnn", channels=(16, 32, 64), dim=256, channels_last=True),
                       DecoderConfig(embed_dim=128, hidden_dim=256, attention_dim=128), vocab)
images = torch.rand(96, 3, 64, 64)
lengths = torch.randint(5, 27, (96,))
captions = torch.randint(4, len(vocab), (96, 27))
def step():
    model.zero_grad(set_to_none=True)
    features = model.encoder(images)
    model.decoder(features, captions, lengths).logits.sum().backward()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
    step()
per_step = []
for _ in range(9):
    start = faults()
    step()
    per_step.append(faults() - start)
print(json.dumps({"set": done, "faults": sorted(per_step)}))
"""


def child(mode: str, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GLIBC_TUNABLES", "MALLOC_"))}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env={**environ, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_memory_is_reused_without_page_faults():
    plain, kept = child("plain"), child("keep")
    assert kept["set"] is True
    # glibc alone gives thousands of pages back at every step and faults them in again at the next
    # (2,000 to 21,000 a step here, median 6,000 to 11,000). Kept, a typical step faults in next to
    # nothing (0 to 4 pages); now and then one still grows the heap (a few thousand pages, in up to 3 of
    # the 9 steps when other processes share the CPU, more on a machine busier still), so the kept
    # run's third quietest step is compared with the plain run's median: six steps may grow the heap.
    plain_median, kept_typical = plain["faults"][4], kept["faults"][2]
    assert plain_median > 1000, plain
    assert kept_typical < plain_median / 20, (kept, plain)


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
