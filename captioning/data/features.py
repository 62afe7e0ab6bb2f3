"""A feature cache: the frozen encoder's grids (L, D), extracted once and read instead of images.

Layout of a cache folder, one *part* per extraction process (``--shard i/n``; ``part-000-of-001``
without sharding)::

    part-000-of-002.index.json   {"image_ids": [...], "grid": [L, D], "dtype": "float16", "meta": {...}}
    part-000-of-002.f16          numpy memmap (rows, L, D) float16, row r = image_ids[r]
    part-000-of-002.done         numpy memmap (rows,) uint8, 1 once row r is flushed to disk

The index is written first (atomically); a row's done flag is set and flushed only after the row's
data was flushed, so an interrupted extraction resumes at the rows whose flag is 0 and a half-written
row is never read as valid. Readers merge every part of the folder. Memory does not grow with the
dataset: grids stay on disk (memmaps opened lazily, once per process / DataLoader worker) and the
index is three flat arrays (24 bytes an image).
"""
from __future__ import annotations

import glob
import json
import os
from typing import Optional, Sequence, Union

import numpy as np
import torch

from captioning.data.karpathy import ImageRecord
from captioning.errors import ConfigError, ImageError

PathLike = Union[str, "os.PathLike[str]"]


def part_name(shard: int, num_shards: int) -> str:
    return f"part-{shard:03d}-of-{num_shards:03d}"


def parse_shard(text: str) -> tuple[int, int]:
    """"i/n" -> (i, n) with 0 <= i < n."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard: expected i/n (e.g. 0/4), got {text!r}") from None
    if not 0 <= i < n:
        raise ConfigError(f"--shard {text}: expected 0 <= i < n")
    return i, n


class FeatureCache:
    """Read-only view of a cache folder: ``cache[image_id]`` -> (L, D) float16 tensor."""

    def __init__(self, root: PathLike):
        self.root = os.fspath(root)
        indexes = sorted(glob.glob(os.path.join(self.root, "*.index.json")))
        if not indexes:
            raise ConfigError(f"{self.root}: not a feature cache (no *.index.json; write one with `captioning extract-features`)")
        self.parts: list[str] = []
        ids, parts, rows, grid = [], [], [], None
        for k, path in enumerate(indexes):
            with open(path) as f:
                index = json.load(f)
            if grid is not None and tuple(index["grid"]) != grid:
                raise ConfigError(f"{path}: grid {index['grid']} differs from the other parts' {list(grid)}")
            grid = tuple(index["grid"])
            self.parts.append(path[: -len(".index.json")])
            n = len(index["image_ids"])
            ids.append(np.asarray(index["image_ids"], dtype=np.int64))
            parts.append(np.full(n, k, dtype=np.int32))
            rows.append(np.arange(n, dtype=np.int64))
        ids, parts, rows = np.concatenate(ids), np.concatenate(parts), np.concatenate(rows)
        order = np.argsort(ids, kind="stable")
        self.ids, self.part_of, self.row_of = ids[order], parts[order], rows[order]  # sorted by image_id
        dup = self.ids[1:][self.ids[1:] == self.ids[:-1]]
        if dup.size:
            raise ConfigError(f"{self.root}: image {int(dup[0])} is in two parts (shards of different extractions?)")
        self.grid_shape = grid  # (L, D)
        self.meta = index.get("meta", {})
        self._maps: Optional[list] = None
        self._pid: Optional[int] = None

    def __getstate__(self) -> dict:  # DataLoader workers reopen the memmaps themselves
        state = dict(self.__dict__)
        state["_maps"], state["_pid"] = None, None
        return state

    def _open(self) -> list:
        if self._maps is None or self._pid != os.getpid():
            self._maps = []
            for base in self.parts:
                rows = len(np.memmap(base + ".done", dtype=np.uint8, mode="r"))
                data = np.memmap(base + ".f16", dtype=np.float16, mode="r", shape=(rows, *self.grid_shape))
                self._maps.append((data, os.open(base + ".done", os.O_RDONLY)))
            self._pid = os.getpid()
        return self._maps

    def _locate(self, image_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, position in the sorted index) of each id."""
        pos = np.searchsorted(self.ids, image_ids).clip(0, max(len(self.ids) - 1, 0))
        return (self.ids[pos] == image_ids) if len(self.ids) else np.zeros(len(image_ids), bool), pos

    def missing(self, image_ids: Sequence[int]) -> list[int]:
        """The ids that have no complete row (not extracted, or the extraction was interrupted)."""
        ids = np.asarray(list(image_ids), dtype=np.int64)
        found, pos = self._locate(ids)
        done = [np.memmap(base + ".done", dtype=np.uint8, mode="r") for base in self.parts]
        ok = np.array([bool(f) and bool(done[self.part_of[p]][self.row_of[p]]) for f, p in zip(found, pos)], dtype=bool)
        return ids[~ok].tolist() if len(ids) else []

    def __contains__(self, image_id: int) -> bool:
        return not self.missing([image_id])

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, image_id: int) -> torch.Tensor:
        found, pos = self._locate(np.asarray([image_id], dtype=np.int64))
        if not found[0]:
            raise ImageError(f"{self.root}: no features for image {image_id}")
        data, done_fd = self._open()[self.part_of[pos[0]]]
        row = int(self.row_of[pos[0]])
        # the done flag is read fresh: a row still being written by a running extraction is refused
        if os.pread(done_fd, 1, row) != b"\x01":
            raise ImageError(f"{self.root}: features of image {image_id} are incomplete (interrupted extraction? rerun it)")
        return torch.from_numpy(np.array(data[row]))  # (L, D) float16, copied out of the memmap


def _open_part(base: str, image_ids: list[int], grid: tuple, meta: dict) -> tuple[np.memmap, np.memmap]:
    """Create a part's files, or reopen them to resume (the image list and grid must match)."""
    index_path = base + ".index.json"
    rows = len(image_ids)
    os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        if index["image_ids"] != image_ids or tuple(index["grid"]) != tuple(grid):
            raise ConfigError(
                f"{index_path}: written for other images or another encoder grid; use a new --out folder "
                f"(or delete {os.path.basename(base)}.*)"
            )
        return (np.memmap(base + ".f16", dtype=np.float16, mode="r+", shape=(rows, *grid)),
                np.memmap(base + ".done", dtype=np.uint8, mode="r+", shape=(rows,)))
    data = np.memmap(base + ".f16", dtype=np.float16, mode="w+", shape=(rows, *grid))
    done = np.memmap(base + ".done", dtype=np.uint8, mode="w+", shape=(rows,))
    data.flush(), done.flush()
    tmp = index_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"image_ids": image_ids, "grid": list(grid), "dtype": "float16", "meta": meta}, f)
    os.replace(tmp, index_path)  # the index appears only once its files exist
    return data, done


@torch.inference_mode()
def extract_features(
    records: Sequence[ImageRecord],
    encoder: torch.nn.Module,
    images_root: str,
    out_dir: PathLike,
    image_size: int,
    batch_size: int = 64,
    num_workers: int = 0,
    shard: tuple[int, int] = (0, 1),
    device: Optional[str] = None,
    meta: Optional[dict] = None,
    progress: bool = True,
    max_batches: Optional[int] = None,
) -> dict:
    """Run ``encoder`` over the images of this shard, resuming a previous run in ``out_dir``.

    Returns ``{"part", "rows", "done", "extracted", "unreadable": [messages]}``. Unreadable images keep
    done = 0 (training refuses them); ``max_batches`` stops early (tests of resuming).
    """
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from captioning.data.datamodule import Collate, ImageDataset

    os.makedirs(out_dir, exist_ok=True)
    i, n = shard
    unique = {r.image_id: r for r in records}
    ids = sorted(unique)[i::n]
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    encoder = encoder.to(device).eval()
    grid = tuple(encoder(torch.zeros(1, 3, image_size, image_size, device=device)).shape[1:])  # (L, D)
    base = os.path.join(os.fspath(out_dir), part_name(i, n))
    data, done = _open_part(base, ids, grid, dict(meta or {}, image_size=image_size))
    row_of = {image_id: r for r, image_id in enumerate(ids)}
    pending = [unique[k] for k, flag in zip(ids, done) if not flag]
    dataset = ImageDataset(pending, images_root, image_size)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=False,
                        collate_fn=Collate(0, "images", dataset.visual_shape, on_bad_image="skip"))
    unreadable, extracted = [], 0
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    with tqdm(total=len(pending), desc=f"features {os.path.basename(base)}", unit="img", disable=not progress) as bar:
        for b, batch in enumerate(loader):
            if max_batches is not None and b >= max_batches:
                break
            unreadable += batch["bad_images"]
            if len(batch["image_ids"]):
                with amp:
                    grids = encoder(batch["images"].to(device, non_blocking=True))  # (B, L, D)
                rows = np.array([row_of[k] for k in batch["image_ids"].tolist()])
                data[rows] = grids.float().cpu().numpy().astype(np.float16)
                data.flush()  # the rows first...
                done[rows] = 1
                done.flush()  # ...then their flags
                extracted += len(rows)
            bar.update(len(batch["image_ids"]) + len(batch["bad_images"]))
    return {"part": base, "rows": len(ids), "done": int(np.asarray(done).sum()), "extracted": extracted,
            "unreadable": unreadable}


def extract_from_config(config: PathLike, out_dir: PathLike, batch_size: int = 64, num_workers: int = 0,
                        shard: tuple[int, int] = (0, 1), annotations: Optional[str] = None,
                        images_root: Optional[str] = None, split_file: Optional[str] = None,
                        device: Optional[str] = None, progress: bool = True) -> dict:
    """``captioning extract-features``: the config's model section picks the encoder, its data section the images."""
    import yaml

    from captioning.data.formats import load_records
    from captioning.models.encoders import build_encoder

    config = os.fspath(config)
    if not os.path.isfile(config):
        raise ConfigError(f"{config}: no such config file")
    with open(config) as f:
        cfg = yaml.safe_load(f) or {}
    model, data = cfg.get("model") or {}, cfg.get("data") or {}
    annotations = annotations or data.get("annotations")
    if not annotations:
        raise ConfigError(f"{config}: no data.annotations (pass --annotations)")
    split_file = split_file or data.get("split_file")
    first = annotations if isinstance(annotations, str) else annotations[0]
    images_root = images_root or data.get("images_root") or os.path.dirname(os.path.abspath(first))
    image_size = int(data.get("image_size", 224))
    name = model.get("encoder", "small_cnn")
    if name == "small_cnn":
        raise ConfigError(f"{config}: model.encoder small_cnn is trained with the decoder; caching its features makes no sense")
    encoder = build_encoder(name, model.get("pretrained", True), model.get("encoder_weights"), model.get("grid_size"))
    records = load_records(annotations, split_file)
    meta = {"encoder": name, "grid_size": model.get("grid_size"), "pretrained": model.get("pretrained", True)}
    return extract_features(records, encoder, images_root, out_dir, image_size, batch_size, num_workers, shard,
                            device, meta, progress)
