"""What one CPU core of the loader makes per second, by route: JPEG decode and resize to S px with
Pillow (the project's route), the GPU route's share of the work on the CPU (the file read and its
header checked: ``--data.decode_device cuda``), and torchvision's decoder with torch's resize on the
CPU; on a GPU, the GPU route's batched decode and resize too (run by hand; docs/PERFORMANCE.md).

    python -m tools.benchmarks.loader_decode --folder /tmp/decode_jpegs --images 300

Writes ``--images`` JPEGs (quality 90, smooth colour fields with noise) of each ``--sources`` size
(320x240, and 640x480: about COCO's photos) into ``--folder``, then times each route over them, in
this one process and thread, the routes alternating over ``--rounds`` rounds (the median is
reported). Images per second per core is 1 / (CPU seconds per image): it does not depend on what
else the machine runs, where the wall-clock rate does. Prints one JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def make_jpegs(folder: Path, count: int, width: int, height: int, seed: int = 0) -> list[Path]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    paths = []
    for i in range(count):
        path = folder / f"{width}x{height}_{i:05d}.jpg"
        if not path.exists():
            a, b, c = rng.uniform(0, 6.28, 3)
            base = np.stack([np.sin(x / 40 + a), np.sin(y / 30 + b), np.sin((x + y) / 50 + c)], -1) * 100 + 128
            pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


def pillow_route(paths, size):
    from captioning.data.images import load_image, to_pixels

    for p in paths:
        to_pixels(load_image(p), size)


def gpu_route_cpu_share(paths, size):
    from captioning.data.images import jpeg_file_bytes

    for p in paths:
        assert jpeg_file_bytes(p) is not None


def torchvision_cpu(paths, size):
    import torch

    from captioning.data.images import decode_jpegs, jpeg_file_bytes, resize_on_device

    cpu = torch.device("cpu")
    data = [jpeg_file_bytes(p) for p in paths]
    images, _ = decode_jpegs(data, [str(p) for p in paths], cpu)
    for image in images:
        resize_on_device(image, size)


def gpu_batches(paths, size, batch: int = 32):
    import torch

    from captioning.data.images import decode_jpegs, jpeg_file_bytes, resize_on_device

    device = torch.device("cuda")
    data = [jpeg_file_bytes(p) for p in paths]  # read first: the GPU's own rate
    torch.cuda.synchronize()
    start = time.perf_counter()
    for k in range(0, len(data), batch):
        images, _ = decode_jpegs(data[k : k + batch], [""] * len(data[k : k + batch]), device)
        torch.stack([resize_on_device(im, size) for im in images])
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", default="/tmp/decode_jpegs", type=Path)
    p.add_argument("--images", type=int, default=300, help="JPEGs of each source size")
    p.add_argument("--sources", default="320x240,640x480")
    p.add_argument("--sizes", default="224,256")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    routes = {
        "pillow (the loader's route)": pillow_route,
        "GPU route: file read + header check": gpu_route_cpu_share,
        "torchvision decode + torch resize, CPU": torchvision_cpu,
    }
    report = {"load_average": os.getloadavg(), "rows": []}
    for source in a.sources.split(","):
        width, height = (int(v) for v in source.split("x"))
        paths = make_jpegs(a.folder, a.images, width, height)
        for size in (int(s) for s in a.sizes.split(",")):
            times: dict = {name: [] for name in routes}
            for _ in range(a.rounds):
                for name, route in routes.items():
                    wall, cpu = time.perf_counter(), time.process_time()
                    route(paths, size)
                    times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
            for name, values in times.items():
                cpu_s = float(np.median([v[1] for v in values])) / len(paths)
                wall_s = float(np.median([v[0] for v in values])) / len(paths)
                row = {
                    "source": source,
                    "size": size,
                    "route": name,
                    "images_per_cpu_s": round(1 / cpu_s, 1),
                    "images_per_wall_s": round(1 / wall_s, 1),
                    "cpu_ms_per_image": round(cpu_s * 1e3, 3),
                }
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
            if torch.cuda.is_available():
                seconds = float(np.median([gpu_batches(paths, size) for _ in range(a.rounds)]))
                row = {
                    "source": source,
                    "size": size,
                    "route": "GPU: nvJPEG batch 32 + resize",
                    "images_per_s": round(len(paths) / seconds, 1),
                }
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
    report["load_average_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
