"""Peak memory and throughput of training from a feature cache vs from images (run by hand).

    python -m tools.benchmarks.feature_cache_memory --out /tmp/fcache --images 20000 --steps 30

Builds a synthetic cache of N images of 196x512 float16 grids (VGG conv5 at 224 px: ~200 KB an
image, ~4 GB for 20,000) and a matching Karpathy file, then trains the soft-attention decoder from
it for some steps in a fresh process, measuring peak RSS (sampled from /proc; DataLoader workers counted
separately) and samples/s. With ``--small`` it repeats on a 10x smaller cache (memory must not grow
with the dataset); with ``--image-steps`` it also trains from JPEGs through a frozen VGG-16 (the
same 14x14x512 grid) for comparison. Prints one JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
L, D = 196, 512


def build(out: str, n: int, jpegs: int = 0) -> str:
    """A cache of n random grids (written in chunks, all rows done) and its annotation file."""
    from PIL import Image

    from captioning.data.features.writer import _open_part

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    words = "a man dog cat on the grass red ball sits runs with in of blue white".split()
    images = []
    for i in range(n):
        split = "train" if i < n - 20 else ("val" if i < n - 10 else "test")
        sents = [{"tokens": list(rng.choice(words, size=rng.integers(6, 14)))} for _ in range(5)]
        images.append({"filepath": "img", "filename": f"{i}.jpg", "imgid": i, "split": split, "sentences": sents})
    for i in [*range(jpegs), *range(n - 20, n)] if jpegs else []:  # the first `jpegs` train images, val and test
        os.makedirs(os.path.join(out, "img"), exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)).save(
            os.path.join(out, "img", f"{i}.jpg"), quality=90
        )
    ann = os.path.join(out, "dataset.json")
    with open(ann, "w") as f:
        json.dump({"images": images}, f)
    cache = os.path.join(out, "features")
    if not os.path.exists(os.path.join(cache, "part-000-of-001.index.json")):
        data, done = _open_part(os.path.join(cache, "part-000-of-001"), list(range(n)), (L, D), {"image_size": 224})
        for s in range(0, n, 1000):
            e = min(n, s + 1000)
            data[s:e] = rng.standard_normal((e - s, L, D), dtype=np.float32).astype(np.float16)
            data.flush()
            done[s:e] = 1
        done.flush()
        del data, done
    return ann


def _status(pid) -> dict:
    """VmRSS / RssAnon / RssFile in MB of a process (Linux /proc)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


class PeakMemory:
    """Samples the RSS of this process and its children (DataLoader workers) every 0.1 s.

    getrusage's ru_maxrss is not used: Linux carries it over a fork + exec from the parent.
    RssAnon is the memory the process really owns; RssFile counts the file pages mapped into it
    (libraries; the cache's pages too before data/features/reader.py read rows instead of mapping them).
    """

    def __init__(self):
        import threading

        self.peak = {"main_rss": 0.0, "main_anon": 0.0, "main_file": 0.0, "worker_rss": 0.0, "worker_anon": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _children(self) -> list:
        pids = []
        for task in os.listdir(f"/proc/{os.getpid()}/task"):
            try:
                with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
                    pids += f.read().split()
            except OSError:
                pass
        return pids

    def _run(self):
        while not self._stop.is_set():
            me = _status("self")
            p = self.peak
            p["main_rss"] = max(p["main_rss"], me.get("VmRSS", 0))
            p["main_anon"] = max(p["main_anon"], me.get("RssAnon", 0))
            p["main_file"] = max(p["main_file"], me.get("RssFile", 0))
            for pid in self._children():
                c = _status(pid)
                p["worker_rss"] = max(p["worker_rss"], c.get("VmRSS", 0))
                p["worker_anon"] = max(p["worker_anon"], c.get("RssAnon", 0))
            self._stop.wait(0.1)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return {f"peak_{k}_mb": round(v, 1) for k, v in self.peak.items()}


def train(ann: str, features: str | None, steps: int, batch: int, workers: int) -> dict:
    """Runs in a fresh process: `steps` training steps; peak RSS and throughput."""
    import lightning as L_
    import torch

    from captioning.data.datamodule import CaptionDataModule
    from captioning.models.encoders import EncoderConfig
    from captioning.training.module import CaptioningModule

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rss0 = _status("self").get("VmRSS", 0)
    memory = PeakMemory()
    dm = CaptionDataModule(
        ann, features=features, batch_size=batch, num_workers=workers, min_word_freq=1, image_size=224
    )
    if features:  # encoder unused but for the grid it would make (checked against the cache's): 14x14x512
        model = CaptioningModule(EncoderConfig("small_cnn", dim=D, pretrained=False, grid_size=14), image_size=224)
    else:  # frozen VGG-16: the same 14x14x512 grid
        model = CaptioningModule(EncoderConfig("vgg16", pretrained=False), image_size=224)
    times = []

    class Clock(L_.Callback):
        def on_train_batch_start(self, *a):
            self.t = time.perf_counter()

        def on_train_batch_end(self, *a):
            times.append(time.perf_counter() - self.t)

    trainer = L_.Trainer(
        max_steps=steps,
        limit_val_batches=0,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Clock()],
    )
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    wall = time.perf_counter() - start
    steady = times[2:] or times  # skip warm-up steps
    return {
        "source": "features" if features else "images",
        "train_pairs": len(dm.records("train")) * 5,
        "steps": len(times),
        "batch": batch,
        "workers": workers,
        "samples_per_s": batch / (sum(steady) / len(steady)),
        "wall_s": wall,
        "rss_after_imports_mb": round(rss0, 1),
        **memory.stop(),
    }


def run_child(*args) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/feature_cache_memory")
    p.add_argument("--images", type=int, default=20000)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--small", action="store_true", help="also measure a 10x smaller cache")
    p.add_argument("--image-steps", type=int, default=0, help="also train this many steps from JPEGs via VGG-16")
    p.add_argument("--child", nargs=5, metavar=("ANN", "FEATURES", "STEPS", "BATCH", "WORKERS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        ann, feats, steps, batch, workers = a.child
        print(json.dumps(train(ann, None if feats == "-" else feats, int(steps), int(batch), int(workers))))
        return
    t = time.perf_counter()
    ann = build(os.path.join(a.out, "big"), a.images, jpegs=a.batch * (a.image_steps + 1) if a.image_steps else 0)
    report = {
        "cache_gb": os.path.getsize(os.path.join(a.out, "big", "features", "part-000-of-001.f16")) / 1e9,
        "build_s": time.perf_counter() - t,
        "runs": [],
    }
    report["runs"].append(run_child(ann, os.path.join(a.out, "big", "features"), a.steps, a.batch, a.workers))
    if a.small:
        small = build(os.path.join(a.out, "small"), a.images // 10)
        report["runs"].append(run_child(small, os.path.join(a.out, "small", "features"), a.steps, a.batch, a.workers))
    if a.image_steps:
        # only the first batch * (steps + 1) images exist as JPEGs: train on those
        with open(ann) as f:
            data = json.load(f)
        keep = a.batch * (a.image_steps + 1)
        data["images"] = data["images"][:keep] + data["images"][-20:]
        sub = os.path.join(a.out, "big", "dataset_images.json")
        with open(sub, "w") as f:
            json.dump(data, f)
        report["runs"].append(run_child(sub, "-", a.image_steps, a.batch, a.workers))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
