"""Streaming figures: the loader's images/s (decode + resize of 320x240 JPEGs, the project's route)
per number of workers at 224 and 256 px, and a whole ``captioning caption FOLDER --out`` run's
images/s and peak memory (docs/PERFORMANCE.md, Streaming).

    python -m tools.benchmarks.stream --folder /tmp/photos --make 20000 --checkpoint model.ckpt

``--make N`` first writes N 320x240 JPEGs into the folder (500 per subfolder); delete it after.
Timings on a shared machine are noisy: compare the rows of one run.
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
from PIL import Image


def make_photos(folder: Path, count: int, seed: int = 0) -> None:
    """``count`` 320x240 JPEGs (quality 90) of smooth colour fields with noise, ~20 KB each: 64 base
    pictures, each file one of them rolled by its own offset."""
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:240, 0:320].astype(np.float32)
    bases = []
    for _ in range(64):
        a, b, c = rng.uniform(0, 6.28, 3)
        base = np.stack([np.sin(x / 40 + a), np.sin(y / 30 + b), np.sin((x + y) / 50 + c)], axis=-1) * 100 + 128
        bases.append(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))
    for i in tqdm(range(count), desc="writing JPEGs", unit="img"):
        sub = folder / f"{i // 500:04d}"
        sub.mkdir(parents=True, exist_ok=True)
        pixels = np.roll(bases[i % 64], (i * 7) % 240, axis=0)
        Image.fromarray(pixels).save(sub / f"{i:07d}.jpg", quality=90)


def loader_rate(folder: Path, size: int, workers: int, limit: int, batch_size: int = 32) -> float:
    """Images/s of the loader reading and resizing the first ``limit`` images of ``folder``."""
    import itertools

    from captioning.data.inputs import iter_sources, load_batches, model_pixels_of

    sources = itertools.islice(iter_sources([str(folder)]), limit)
    start, n = time.perf_counter(), 0
    for batch in load_batches(sources, model_pixels_of([(size, "bilinear")]), batch_size, workers):
        n += len(batch)
    return n / (time.perf_counter() - start)


def caption_run(folder: Path, checkpoint: str, out: Path, workers: int, batch_size: int) -> dict:
    """A ``captioning caption FOLDER --out`` child process: images/s and its peak RSS (MB)."""
    out.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "captioning.cli", "caption", str(folder), "--checkpoint", checkpoint]
    argv += ["--out", str(out), "--device", "cpu", "--num-beams", "1", "--batch-size", str(batch_size)]
    argv += ["--num-workers", str(workers)]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    lines = sum(1 for _ in open(out))
    return {
        "images": lines,
        "seconds": round(seconds, 1),
        "images_per_s": round(lines / seconds, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "exit": os.waitstatus_to_exitcode(status),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", required=True, type=Path)
    p.add_argument("--make", type=int, default=0, help="write this many JPEGs into --folder first")
    p.add_argument("--checkpoint", default=None, help="a model for the caption run (none: the loader only)")
    p.add_argument("--loader-images", type=int, default=2000, help="images per loader measurement")
    p.add_argument("--workers", default="0,1,2", help="loader workers to measure, comma-separated")
    p.add_argument("--caption-workers", default="0,1", help="workers of the caption runs, comma-separated")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args(argv)
    if args.make:
        make_photos(args.folder, args.make)
    rows = []
    for size in (224, 256):
        for workers in map(int, args.workers.split(",")):
            rate = loader_rate(args.folder, size, workers, args.loader_images, args.batch_size)
            rows.append({"section": "loader", "size": size, "workers": workers, "images_per_s": round(rate, 1)})
            print(json.dumps(rows[-1]), flush=True)
    if args.checkpoint:
        for workers in map(int, args.caption_workers.split(",")):
            row = caption_run(args.folder, args.checkpoint, Path("/tmp/stream_bench.jsonl"), workers, args.batch_size)
            rows.append({"section": "caption", "workers": workers, **row})
            print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
