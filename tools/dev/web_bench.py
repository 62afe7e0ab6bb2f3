"""Latency and throughput of the web API, measured from a client on the same machine.

    python -m tools.dev.web_bench --checkpoint CKPT [--image photo.jpg] [--out bench.json]
    python -m tools.dev.web_bench --url http://127.0.0.1:7860 [--image photo.jpg]

With ``--checkpoint`` it starts ``python -m captioning.web`` on a free port of 127.0.0.1, measures,
and stops it (and also reports the server's resident memory before and after the load); with
``--url`` it measures a server already running. Without ``--image`` the upload is a synthetic
640 x 480 JPEG (quality 90).

Measured: the time from sending the upload to having the caption (one request at a time, the
median and 90th percentile of ``--repeats`` requests after 3 warm-up ones), the same with the GIF
and the display image (what the page asks for), and requests per second with ``--concurrency``
clients sending ``--requests`` requests in all.
"""

from __future__ import annotations

import argparse
import io
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from captioning.web.client import caption, wait_for_server


def synthetic_jpeg(width: int = 640, height: int = 480) -> bytes:
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width * 200, y / height * 160, (x + y) / (width + height) * 220], -1)
    image = Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    draw.ellipse([80, 90, 260, 270], fill=(200, 40, 40))
    draw.rectangle([380, 200, 560, 380], fill=(40, 60, 200))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def start_server(checkpoints: list[str], extra: list[str], timeout: float = 300.0):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="captioning-web-bench-", suffix=".log", delete=False)
    args = [sys.executable, "-m", "captioning.web", "--port", str(port), "--log-level", "warning", *extra]
    for c in checkpoints:
        args += ["--checkpoint", c]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    problem = wait_for_server(url, proc, timeout)
    if problem:
        raise SystemExit(f"the server {problem}; see {log.name}")
    return proc, url


def _summary(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {
        "median_s": round(statistics.median(ordered), 4),
        "p90_s": round(ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))], 4),
        "min_s": round(ordered[0], 4),
        "n": len(ordered),
    }


def measure(
    url: str,
    data: bytes,
    model: str | None,
    num_beams: int,
    repeats: int,
    concurrency: int,
    requests: int,
    pid: int | None = None,
) -> dict:
    def one(**extra):
        start = time.perf_counter()
        out = caption(data, url=url, model=model, num_beams=num_beams, filename="photo.jpg", **extra)
        return time.perf_counter() - start, out

    for _ in range(3):
        one()
        one(return_gif=True, return_image=True)
    report: dict = {"url": url, "model": model, "num_beams": num_beams, "upload_bytes": len(data)}
    runs = [one() for _ in range(repeats)]
    report["caption"] = _summary([s for s, _ in runs])
    report["caption"]["server_ms_median"] = {
        k: statistics.median(out["timing_ms"][k] for _, out in runs) for k in ("queue", "decode", "caption")
    }
    report["generated_text"] = runs[-1][1]["generated_text"]
    runs = [one(return_gif=True, return_image=True) for _ in range(repeats)]
    report["caption_gif_image"] = _summary([s for s, _ in runs])
    report["caption_gif_image"]["render_ms_median"] = statistics.median(out["timing_ms"]["render"] for _, out in runs)

    rss = [_rss_mb(pid)] if pid else []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            rss.append(_rss_mb(pid))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    if pid:
        watcher.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: one(), range(requests)))
    elapsed = time.perf_counter() - start
    stop.set()
    if pid:
        watcher.join()
    texts = {out["generated_text"] for _, out in results}
    report["load"] = {
        "concurrency": concurrency,
        "requests": requests,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(requests / elapsed, 2),
        "latency": _summary([s for s, _ in results]),
        "largest_batch": max(out["timing_ms"]["batch"] for _, out in results),
        "distinct_captions": len(texts),
    }
    values = [r for r in rss if r is not None]
    if values:
        report["load"]["rss_mb"] = {
            "before": round(values[0], 1),
            "peak": round(max(values), 1),
            "growth": round(max(values) - values[0], 1),
        }
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.dev.web_bench", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--checkpoint", action="append", help="start a server for this checkpoint (repeatable)")
    where.add_argument("--url", help="measure a running server")
    p.add_argument("--model", default=None, help="which served model (default: the first)")
    p.add_argument("--image", default=None, help="the upload (default: a synthetic 640 x 480 JPEG)")
    p.add_argument("--num-beams", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--server-arg", action="append", default=[], help="extra argument for the server (repeatable)")
    p.add_argument("--out", default=None, help="write the report JSON here")
    args = p.parse_args(argv)
    data = Path(args.image).read_bytes() if args.image else synthetic_jpeg()
    proc = None
    if args.checkpoint:
        proc, url = start_server(args.checkpoint, args.server_arg)
    else:
        url = args.url
    try:
        report = measure(
            url,
            data,
            args.model,
            args.num_beams,
            args.repeats,
            args.concurrency,
            args.requests,
            pid=proc.pid if proc else None,
        )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    report["checkpoints"] = args.checkpoint
    report["image"] = args.image or "synthetic 640x480 JPEG"
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    c, g, load = report["caption"], report["caption_gif_image"], report["load"]
    print(
        f"\nupload to caption: median {c['median_s'] * 1000:.0f} ms (p90 {c['p90_s'] * 1000:.0f} ms); with GIF and "
        f"image: median {g['median_s'] * 1000:.0f} ms; {load['concurrency']} clients: "
        f"{load['requests_per_s']:.1f} requests/s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
