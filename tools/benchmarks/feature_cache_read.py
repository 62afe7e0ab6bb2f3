"""Read rates of feature caches: float32, float16 and a pooled grid, rows in random and in file order,
from disk (the file's pages dropped from the page cache first) and from the page cache (run by hand).

    python -m tools.benchmarks.feature_cache_read --out /tmp/fread --images 2000

Writes three caches of the same ``--images`` rows (docs/PERFORMANCE.md, Feature cache): the
``--grid`` (default 14x14x2048, ResNet-101's at COCO's settings) in float32 and float16, and the
grid pooled to ``--pool`` x ``--pool`` in float16. Then, for each, reads every row once through
:class:`~captioning.data.features.reader.FeatureCache` (what a loader worker does for each sample: one
positional read into a fresh array) in random order, a random tenth of them, and in file order, cold (``posix_fadvise``
DONTNEED drops the file's pages first, so the rows come from the disk) and warm (a second pass; the
file is in the page cache), and reports rows/s, MB/s, CPU seconds per row and the MB the pass made
the kernel fetch from the disk (/proc/self/io; readahead included), the median of ``--repeats`` passes
of each kind, the readers alternating (the disk of a shared machine varies several-fold from pass to
pass). ``--memmap`` adds the
same reads through a memory map of the file (the reader before this one), for comparison.

A cache larger than the machine's free memory is not needed to measure the cold rate: the pages are
dropped per file. Prints one JSON report; the caches are left in ``--out`` (delete them after).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def write_cache(folder: str, n: int, grid: tuple[int, int], dtype: str) -> str:
    """A cache of ``n`` rows of ``grid`` in ``dtype`` (every row done), written in chunks of real
    (non-zero) values so that every block is on the disk."""
    from captioning.data.features.writer import _open_part

    base = os.path.join(folder, "part-000-of-001")
    if os.path.exists(base + ".index.json"):
        return folder
    data, done = _open_part(base, list(range(n)), grid, {"encoder": "synthetic"}, dtype)
    rng = np.random.default_rng(0)
    chunk = max(1, (64 << 20) // (grid[0] * grid[1] * np.dtype(dtype).itemsize))  # ~64 MB at a time
    block = rng.standard_normal((chunk, *grid), dtype=np.float32).astype(dtype)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        data[start:stop] = block[: stop - start] + np.asarray(start, dtype)  # rows differ from chunk to chunk
        data.flush()
        done[start:stop] = 1
    done.flush()
    del data, done
    return folder


def drop_from_page_cache(path: str) -> None:
    """Ask the kernel to drop the file's clean pages (the next read comes from the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_bytes_read() -> int:
    """Bytes this process made the kernel fetch from storage so far (/proc/self/io read_bytes:
    readahead included), 0 where the kernel does not say."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def read_all(folder: str, order: np.ndarray, memmap: bool) -> tuple[float, float, int]:
    """(wall s, CPU s, bytes fetched from storage) of reading every row of ``order`` (image ids) once,
    through a freshly opened cache (its own file descriptors, as a new loader worker has)."""
    from captioning.data.features.reader import FeatureCache

    cache = FeatureCache(folder)
    maps = cache.arrays() if memmap else None
    start, cpu, disk = time.perf_counter(), time.process_time(), disk_bytes_read()
    for image_id in order.tolist():
        if memmap:
            row = np.array(maps[0][int(cache.row_of[image_id])])  # ids are 0..n-1 in one part
        else:
            row = cache[image_id]
        del row
    wall, cpu, disk = time.perf_counter() - start, time.process_time() - cpu, disk_bytes_read() - disk
    del maps
    cache.close()
    return wall, cpu, disk


ORDERS = ("random", "random tenth", "file order")


def measure(folder: str, memmap: bool, repeats: int, seed: int = 0) -> list[dict]:
    """Every pass (order x reader x disk / page cache) ``repeats`` times, the readers alternating; the
    median of each. ``random tenth`` reads a tenth of the rows in random order: as from a cache larger
    than memory, where the neighbours a read pulls in are gone before they are asked for (its
    ``disk_mb_read`` against the MB asked for is the read amplification)."""
    from captioning.data.features.reader import DTYPES, FeatureCache

    cache = FeatureCache(folder)
    n, row_mb = len(cache), cache.row_bytes / 1e6
    data_file = cache.parts[0] + DTYPES[cache.dtype]
    runs: dict = {}
    for rep in range(repeats):
        for order_name in ORDERS:
            rng = np.random.default_rng(seed + rep)
            order = {
                "random": rng.permutation(n),
                "random tenth": rng.permutation(n)[: max(1, n // 10)],
                "file order": np.arange(n),
            }[order_name]
            for reader in ("read", "memmap") if memmap else ("read",):
                drop_from_page_cache(data_file)
                for state in ("disk", "page cache"):
                    wall, cpu, disk = read_all(folder, order, reader == "memmap")
                    runs.setdefault((order_name, reader, state), []).append((len(order) / wall, cpu / len(order), disk))
    rows = []
    for (order_name, reader, state), values in runs.items():
        rate = float(np.median([v[0] for v in values]))
        count = n // 10 if order_name == "random tenth" else n
        rows.append(
            {
                "cache": f"{cache.grid_shape[0]}x{cache.grid_shape[1]} {cache.dtype}",
                "row_mb": round(row_mb, 3),
                "cache_gb": round(cache.nbytes / 1e9, 2),
                "order": order_name,
                "reader": reader,
                "from": state,
                "rows_per_s": round(rate, 1),
                "rows_per_s_each": [round(v[0], 1) for v in values],
                "mb_per_s": round(rate * row_mb, 1),
                "cpu_ms_per_row": round(float(np.median([v[1] for v in values])) * 1e3, 3),
                "disk_mb_read": round(float(np.median([v[2] for v in values])) / 1e6, 1),
                "mb_asked": round(count * row_mb, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/feature_cache_read")
    p.add_argument("--images", type=int, default=2000, help="rows of each cache")
    p.add_argument("--grid", default="196x2048", help="L x D of the full grid")
    p.add_argument("--pool", type=int, default=7, help="the pooled grid's side")
    p.add_argument("--memmap", action="store_true", help="also read through a memory map")
    p.add_argument("--repeats", type=int, default=3, help="passes of each kind (the median is reported)")
    a = p.parse_args(argv)
    L, D = (int(x) for x in a.grid.split("x"))
    caches = [
        (os.path.join(a.out, "float32"), (L, D), "float32"),
        (os.path.join(a.out, "float16"), (L, D), "float16"),
        (os.path.join(a.out, f"pool{a.pool}_float16"), (a.pool * a.pool, D), "float16"),
    ]
    report = {"images": a.images, "load_average": os.getloadavg(), "rows": []}
    for folder, grid, dtype in caches:
        start = time.perf_counter()
        write_cache(folder, a.images, grid, dtype)
        print(f"{folder}: written in {time.perf_counter() - start:.1f} s", flush=True)
    for folder, _, _ in caches:
        report["rows"] += measure(folder, a.memmap, a.repeats)
    report["load_average_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
