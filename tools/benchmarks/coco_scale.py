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


def make(out: Path, seed: int = 0, kept: int = 10_000) -> Path:
    """Write ``out/dataset_coco.json`` and its image links (see the module docstring)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    total = sum(SPLITS.values())
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
    for split, count in SPLITS.items():
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


def measure(command: list[str], every: float = 0.2) -> dict:
    """Wall time of ``command`` run in a child process, its peak RSS (MB; from wait4) and the largest
    peak RSS of its descendants (the loader workers: their VmHWM sampled every ``every`` s)."""
    import threading

    if command and command[0] == "captioning":
        command = [sys.executable, "-m", "captioning.cli", *command[1:]]
    start = time.perf_counter()
    proc = subprocess.Popen(command)
    peaks: dict[int, float] = {}
    done = threading.Event()

    def sample():
        while not done.wait(every):
            for pid in _tree(proc.pid)[1:]:
                hwm = _hwm_mb(pid)
                if hwm is not None:
                    peaks[pid] = max(peaks.get(pid, 0.0), hwm)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    thread.join()
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "children": len(peaks),
        "child_peak_rss_mb": round(max(peaks.values())) if peaks else None,
        "exit": os.waitstatus_to_exitcode(status),
    }


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
    sc = sub.add_parser("score", help="time coco-caption's scoring of an evaluate --results file")
    sc.add_argument("--annotations", required=True)
    sc.add_argument("--results", required=True)
    r = sub.add_parser("measure", help="time and peak memory of a command (after --)")
    r.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.what == "make":
        print(make(args.out, args.seed))
        return 0
    if args.what == "score":
        print(json.dumps(score_time(args.annotations, args.results)))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    print(json.dumps({"command": " ".join(command), **measure(command)}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
