"""A COCO-sized synthetic Karpathy file, and the time and peak memory of the commands on it
(docs/PERFORMANCE.md, COCO-sized data).

    python -m tools.benchmarks.coco_scale make --out /tmp/coco_synth
    python -m tools.benchmarks.coco_scale measure -- captioning prepare \\
        --annotations /tmp/coco_synth/dataset_coco.json --no-image-check
    python -m tools.benchmarks.coco_scale score --annotations /tmp/coco_synth/dataset_coco.json \\
        --results results.json

``make`` writes ``dataset_coco.json`` as Karpathy's: 123,287 images (113,287 train + restval, 5,000
val, 5,000 test, COCO's split sizes), 5 captions each, words drawn from a Zipfian vocabulary whose
exponent is chosen so that a cut of 5 (``--min-word-freq 5``) keeps about 10,000 words, as COCO's
does; the images are symbolic links (``train2014/``, ``val2014/`` beside the file, its images folder) to
four 640x480 JPEGs. ``measure`` runs a command
in a child process and prints its wall time and peak resident memory (the largest of the process
and its waited-for children).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: COCO's Karpathy split sizes
SPLITS = {"train": 82_783, "restval": 30_504, "val": 5_000, "test": 5_000}
CAPTIONS = 5
#: the distinct words the Zipfian draw chooses from
WORDS = 40_000


def _words(n: int) -> list[str]:
    """``n`` distinct lower-case words (letters only, as Karpathy's tokens)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = []
    for i in range(n):
        word, k = "", i + 26  # two letters at least
        while k:
            k, r = divmod(k, 26)
            word = letters[r] + word
        out.append(word)
    return out


def zipf_exponent(tokens: int, kept: int, cut: int = 5, words: int = WORDS) -> float:
    """The exponent s of p(rank) ~ rank^-s over ``words`` words for which about ``kept`` words are
    expected ``cut`` times or more among ``tokens`` draws (bisection)."""
    ranks = np.arange(1, words + 1, dtype=np.float64)
    low, high = 0.5, 3.0
    for _ in range(60):
        s = (low + high) / 2
        p = ranks**-s
        expected = tokens * p / p.sum()
        if (expected >= cut).sum() > kept:
            low = s
        else:
            high = s
    return (low + high) / 2


def make(out: Path, seed: int = 0, kept: int = 10_000, scale: float = 1.0) -> Path:
    """Write ``out/dataset_coco.json`` and its image links (see the module docstring); ``scale``:
    a file of that share of COCO's images (each split at least one) and of its ``kept`` words."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    splits = {split: max(1, round(count * scale)) for split, count in SPLITS.items()}
    kept = max(1, round(kept * scale))
    total = sum(splits.values())
    lengths = np.clip(rng.poisson(10.5, size=total * CAPTIONS), 6, 40)  # COCO: mean ~10.5 words
    s = zipf_exponent(int(lengths.sum()), kept)
    p = np.arange(1, WORDS + 1, dtype=np.float64) ** -s
    words = np.array(_words(WORDS), dtype=object)
    draws = words[rng.permutation(WORDS)][rng.choice(WORDS, size=int(lengths.sum()), p=p / p.sum())]
    sources = out / "sources"
    sources.mkdir(parents=True, exist_ok=True)
    for k in range(4):
        pixels = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(sources / f"source{k}.jpg", quality=85)
    offsets = np.concatenate([[0], np.cumsum(lengths)])  # where each caption's words start in the draws
    images, start, imgid = [], 0, 0
    for split, count in splits.items():
        folder = "val2014" if split in ("val", "test", "restval") else "train2014"
        (out / folder).mkdir(parents=True, exist_ok=True)
        for _ in range(count):
            name = f"COCO_{folder}_{imgid:012d}.jpg"
            link = out / folder / name
            if not link.is_symlink():
                link.symlink_to(sources / f"source{imgid % 4}.jpg")
            sentences = []
            for _ in range(CAPTIONS):
                first = int(offsets[start])
                tokens = list(draws[first : first + int(lengths[start])])
                sentences.append({"tokens": tokens, "raw": " ".join(tokens).capitalize() + "."})
                start += 1
            images.append(
                {
                    "filepath": folder,
                    "filename": name,
                    "imgid": imgid,
                    "cocoid": imgid,
                    "split": split,
                    "sentences": sentences,
                }
            )
            imgid += 1
    path = out / "dataset_coco.json"
    with open(path, "w") as f:
        json.dump({"images": images, "dataset": "coco"}, f)
    return path


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _hwm_mb(pid: int) -> float | None:
    """The peak resident memory of a live process so far (VmHWM), MB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def uss_mb(pid: int) -> float | None:
    """The memory only this process maps (USS: Private_Clean + Private_Dirty of
    /proc/PID/smaps_rollup), MB: what a forked loader worker has copied of its parent's pages, or
    keeps alone because the parent wrote its copy, plus what it allocated itself."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            kb = sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean:", "Private_Dirty:")))
    except (OSError, ValueError):
        return None
    return kb / 1024


def measure(command: list[str], every: float = 0.5) -> dict:
    """Wall time of ``command`` run in a child process, its CPU seconds and peak RSS (MB; from
    wait4), and of its descendants (the loader workers), sampled every ``every`` s: the largest
    peak RSS (VmHWM, which counts the pages a worker shares with its parent) and each one's
    largest USS (:func:`uss_mb`, the pages it holds alone), and the command's own largest USS."""
    import threading

    if command and command[0] == "captioning":
        command = [sys.executable, "-m", "captioning.cli", *command[1:]]
    start = time.perf_counter()
    proc = subprocess.Popen(command)
    peaks: dict[int, float] = {}
    private: dict[int, float] = {}
    done = threading.Event()

    def sample():
        while not done.wait(every):
            for k, pid in enumerate(_tree(proc.pid)):
                if k:
                    hwm = _hwm_mb(pid)
                    if hwm is not None:
                        peaks[pid] = max(peaks.get(pid, 0.0), hwm)
                uss = uss_mb(pid)
                if uss is not None:
                    private[pid] = max(private.get(pid, 0.0), uss)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    thread.join()
    workers = sorted((round(v) for pid, v in private.items() if pid != proc.pid), reverse=True)
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "peak_uss_mb": round(private.get(proc.pid, 0.0)),
        "children": len(peaks),
        "child_peak_rss_mb": round(max(peaks.values())) if peaks else None,
        "child_peak_uss_mb": workers,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "exit": os.waitstatus_to_exitcode(status),
    }


def workers(
    annotations: str,
    num_workers: int,
    batches: int = 0,
    images: bool = False,
    collect: bool = False,
    parent_collect: bool = False,
) -> dict:
    """Each training loader worker's private memory (USS) after ``batches`` batches of 96 pairs (0:
    one epoch), the demo's loader settings at COCO's size: what reading the records costs a worker.
    Without ``images`` a sample's image is a constant tensor, so that an epoch takes seconds and the
    figure is the records' side alone; ``collect``: each worker runs a full garbage collection at
    its first sample (as Python may at any time), which walks every object it inherited;
    ``parent_collect``: the training process runs one after the first batch (as scoring a
    validation does): the pages it writes are then no longer shared, and their old copies count in
    the workers' USS."""
    import gc

    import torch

    from captioning.data.captions import CaptionData
    from captioning.data.datasets import ImageDataset

    data = CaptionData(annotations, batch_size=96, num_workers=num_workers, image_size=64, min_word_freq=5)
    data.setup("fit")
    read = ImageDataset.visual
    collected = []

    def visual(self, record):
        if collect and not collected:
            collected.append(gc.collect())
        return read(self, record) if images else torch.zeros(3, 64, 64)

    ImageDataset.visual = visual
    start = time.perf_counter()
    loader = data.train_dataloader()
    batches = batches or len(loader)
    it = iter(loader)
    next(it)
    first = {pid: uss_mb(pid) for pid in _tree(os.getpid())[1:]}
    if parent_collect:
        gc.collect()
    for _ in range(batches - 1):
        next(it)
    last = {pid: uss_mb(pid) for pid in _tree(os.getpid())[1:]}
    return {
        "workers": num_workers,
        "batches": batches,
        "seconds": round(time.perf_counter() - start, 1),
        "main_rss_mb": round(_rss_mb(os.getpid())),
        "main_uss_mb": round(uss_mb(os.getpid())),
        "worker_uss_mb_after_one_batch": sorted(round(v) for v in first.values() if v is not None),
        "worker_uss_mb": sorted(round(v) for v in last.values() if v is not None),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def score_time(annotations: str, results: str, split: str = "test") -> dict:
    """Seconds of coco-caption's scoring (metrics/coco.py, every metric it has without SPICE) of a
    results file (``evaluate --results``) against the split's references, apart from decoding."""
    from captioning.data.formats import load_records
    from captioning.metrics.coco import CocoScorer

    references = {r.image_id: list(r.captions) for r in load_records(annotations) if r.split == split}
    with open(results) as f:
        predictions = {row["image_id"]: row["caption"] for row in json.load(f)}
    references = {i: references[i] for i in predictions}
    start = time.perf_counter()
    with CocoScorer() as scorer:
        scores = scorer(references, predictions)
    return {"images": len(predictions), "seconds": round(time.perf_counter() - start, 1), "scores": scores}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("make", help="write the synthetic Karpathy file and its image links")
    m.add_argument("--out", required=True, type=Path)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--scale", type=float, default=1.0, help="this share of COCO's images and words (a small file)")
    sc = sub.add_parser("score", help="time coco-caption's scoring of an evaluate --results file")
    sc.add_argument("--annotations", required=True)
    sc.add_argument("--results", required=True)
    w = sub.add_parser("workers", help="each training loader worker's private memory after reading the records")
    w.add_argument("--annotations", required=True)
    w.add_argument("--workers", type=int, default=4)
    w.add_argument("--batches", type=int, default=0, help="batches of 96 pairs to read (default: one epoch)")
    w.add_argument("--images", action="store_true", help="read the images too (slow: 640x480 JPEGs)")
    w.add_argument("--collect", action="store_true", help="a full garbage collection in each worker")
    w.add_argument("--parent-collect", action="store_true", help="a full garbage collection in the main process")
    r = sub.add_parser("measure", help="time and peak memory of a command (after --)")
    r.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.what == "make":
        print(make(args.out, args.seed, scale=args.scale))
        return 0
    if args.what == "workers":
        print(
            json.dumps(
                workers(args.annotations, args.workers, args.batches, args.images, args.collect, args.parent_collect)
            )
        )
        return 0
    if args.what == "score":
        print(json.dumps(score_time(args.annotations, args.results)))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    print(json.dumps({"command": " ".join(command), **measure(command)}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
