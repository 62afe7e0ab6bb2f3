"""``captioning extract-features``: a training config's frozen encoder over all its images, once,
into a feature cache (the layout is described in data/features/reader.py, which reads it).

The config is read by the same parser as ``captioning fit`` (LightningCLI), so its defaults and
overrides are exactly those of training: the model's encoder settings pick the encoder, the data
settings the images.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from captioning.common import PathLike, default_device, grid_shape
from captioning.data.datasets import Collate, ImageDataset
from captioning.data.features.reader import DTYPES
from captioning.data.records import ImageRecord
from captioning.errors import ConfigError
from captioning.models.encoders import build_encoder


def part_name(shard: int, num_shards: int) -> str:
    return f"part-{shard:03d}-of-{num_shards:03d}"


def parse_shard(text: str) -> tuple[int, int]:
    """ "i/n" -> (i, n) with 0 <= i < n."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard: expected i/n (e.g. 0/4), got {text!r}") from None
    if not 0 <= i < n:
        raise ConfigError(f"--shard {text}: expected 0 <= i < n")
    return i, n


def check_dtype(dtype: str) -> str:
    """``dtype`` if a cache can store it (data/features/reader.py: DTYPES), else one line of ConfigError."""
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
    return dtype


def check_pool(pool: int | None) -> int | None:
    """``pool`` if it is a grid side (an integer >= 1) or None, else one line of ConfigError."""
    if pool is not None and (isinstance(pool, bool) or not isinstance(pool, int) or pool < 1):
        raise ConfigError(f"--pool {pool}: expected a grid side >= 1 (e.g. 7 for a 7x7 grid)")
    return pool


def _open_part(
    base: str, image_ids: list[int], grid: tuple, meta: dict, dtype: str = "float16"
) -> tuple[np.memmap, np.memmap]:
    """Create a part's files, or reopen them to resume (the image list, grid and dtype must match)."""
    index_path = base + ".index.json"
    rows = len(image_ids)
    suffix = DTYPES[check_dtype(dtype)]
    os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
    if os.path.exists(index_path):
        from captioning.data.features.reader import check_meta, index_dtype, read_index

        index = read_index(index_path)  # one line for a damaged index
        if index["image_ids"] != image_ids or tuple(index["grid"]) != tuple(grid):
            raise ConfigError(
                f"{index_path}: written for other images or another encoder grid (or --pool); use a new --out "
                f"folder (or delete {os.path.basename(base)}.*)"
            )
        if index_dtype(index) != dtype:
            raise ConfigError(
                f"{index_path}: written with --dtype {index_dtype(index)}, this run has {dtype}; use a new --out "
                f"folder or the same --dtype"
            )
        recorded = index.get("meta")
        check_meta(recorded if isinstance(recorded, dict) else {}, meta, index_path)  # the same encoder settings
        _check_resumable(base, rows, grid, dtype)  # before mapping: np.memmap "r+" would zero-extend a cut file
        return (
            np.memmap(base + suffix, dtype=dtype, mode="r+", shape=(rows, *grid)),
            np.memmap(base + ".done", dtype=np.uint8, mode="r+", shape=(rows,)),
        )
    data = np.memmap(base + suffix, dtype=dtype, mode="w+", shape=(rows, *grid))
    done = np.memmap(base + ".done", dtype=np.uint8, mode="w+", shape=(rows,))
    data.flush(), done.flush()
    tmp = index_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"image_ids": image_ids, "grid": list(grid), "dtype": dtype, "meta": meta}, f)
    os.replace(tmp, index_path)  # the index appears only once its files exist
    return data, done


def _check_resumable(base: str, rows: int, grid: tuple, dtype: str) -> None:
    """A part resumed must have the data and done files its index says, of their exact sizes: a file
    cut short (a full disk, a partial copy) would be zero-extended by mapping it for writing, its rows
    then read as features of zeros with their done flags still set. One line naming the file."""
    sizes = {DTYPES[dtype]: rows * int(np.prod(grid)) * np.dtype(dtype).itemsize, ".done": rows}
    for suffix, size in sizes.items():
        path = base + suffix
        actual = os.path.getsize(path) if os.path.isfile(path) else None
        if actual != size:
            found = "missing" if actual is None else f"{actual:,} bytes"
            raise ConfigError(
                f"{path}: {found}, but its index lists {rows} images of grid {list(grid)} ({size:,} bytes): "
                f"the part is damaged (cut by a full disk or a partial copy?) and cannot be resumed; delete "
                f"{os.path.basename(base)}.* or use a new --out folder"
            )


def pool_grid(grids: torch.Tensor, side: int) -> torch.Tensor:
    """(B, L, D) annotation vectors on a gh x gw grid (row-major) -> (B, side * side, D), adaptive
    average pooling as the encoders' own ``grid_size`` does (the same values where the sides divide)."""
    gh, gw = grid_shape(grids.size(1))
    if (gh, gw) == (side, side):
        return grids
    maps = grids.transpose(1, 2).reshape(grids.size(0), grids.size(2), gh, gw)  # (B, D, gh, gw)
    return torch.nn.functional.adaptive_avg_pool2d(maps.float(), side).flatten(2).transpose(1, 2)


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
    device: str | None = None,
    meta: dict | None = None,
    progress: bool = True,
    max_batches: int | None = None,
    images: Callable[[list[ImageRecord]], ImageDataset] | None = None,
    dtype: str = "float16",
    pool: int | None = None,
) -> dict:
    """Run ``encoder`` over the images of this shard, resuming a previous run in ``out_dir``.

    ``images``: the image dataset of a list of records (CaptionData.image_dataset: image files
    or WebDataset shards, resized with the model's interpolation); default: the files under
    ``images_root``, resized with the encoder's interpolation.

    ``dtype``: the stored type (data/features/reader.py: DTYPES; float16 halves the cache; a value that
    float16 cannot hold is a one-line error naming the image). ``pool``: average-pool the grid to
    ``pool`` x ``pool`` (recorded as the meta's ``grid_size`` and ``pool``: a model trained on the
    cache needs ``encoder.grid_size`` ``pool``, so that it pools new images' grids alike).

    Returns ``{"part", "rows", "done", "extracted", "unreadable": [messages]}``. Unreadable images keep
    done = 0 (training refuses them); ``max_batches`` stops early (tests of resuming).
    """

    check_dtype(dtype), check_pool(pool)
    os.makedirs(out_dir, exist_ok=True)
    i, n = shard
    unique = {r.image_id: r for r in records}
    ids = sorted(unique)[i::n]
    device = default_device(device)
    encoder = encoder.to(device).eval()
    encode = encoder if pool is None else (lambda x: pool_grid(encoder(x), pool))
    grid = tuple(encode(torch.zeros(1, 3, image_size, image_size, device=device)).shape[1:])  # (L, D)
    base = os.path.join(os.fspath(out_dir), part_name(i, n))
    interpolation = getattr(encoder, "preprocessing", {}).get("interpolation", "bilinear")
    # the resize is recorded with the image size (training refuses a cache resized otherwise)
    recorded = {"interpolation": interpolation, **(meta or {}), "image_size": image_size}
    if pool is not None:
        recorded.update(grid_size=pool, pool=pool)
    data, done = _open_part(base, ids, grid, recorded, dtype)
    row_of = {image_id: r for r, image_id in enumerate(ids)}
    pending = [unique[k] for k, flag in zip(ids, done) if not flag]
    if images is None:
        dataset = ImageDataset(pending, images_root, image_size, interpolation=interpolation)
    else:
        dataset = images(pending)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle=False,
        collate_fn=Collate(0, "images", dataset.visual_shape, on_bad_image="skip"),
    )
    unreadable, extracted = [], 0
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    with tqdm(
        total=len(pending), desc=f"features {os.path.basename(base)}", unit="img", disable=None if progress else True
    ) as bar:
        for b, batch in enumerate(loader):
            if max_batches is not None and b >= max_batches:
                break
            unreadable += batch["bad_images"]
            if len(batch["image_ids"]):
                with amp:
                    grids = encode(batch["images"].to(device, non_blocking=True))  # (B, L, D)
                rows = np.array([row_of[k] for k in batch["image_ids"].tolist()])
                values = grids.float().cpu().numpy()
                with np.errstate(over="ignore"):  # an overflow is refused below, naming the image
                    stored = values.astype(dtype)
                if not np.isfinite(stored).all():
                    _refuse_nonfinite(values, stored, batch["image_ids"].tolist(), dtype)
                data[rows] = stored
                data.flush()  # the rows first...
                done[rows] = 1
                done.flush()  # ...then their flags
                extracted += len(rows)
            bar.update(len(batch["image_ids"]) + len(batch["bad_images"]))
    return {
        "part": base,
        "rows": len(ids),
        "done": int(np.asarray(done).sum()),
        "extracted": extracted,
        "unreadable": unreadable,
    }


def _refuse_nonfinite(values: np.ndarray, stored: np.ndarray, image_ids: list[int], dtype: str) -> None:
    """One line naming the first image whose features ``dtype`` cannot hold (or the encoder made non-finite)."""
    bad = int(np.flatnonzero(~np.isfinite(stored).reshape(len(stored), -1).all(axis=1))[0])
    finite = np.isfinite(values[bad])
    largest = float(np.abs(values[bad][finite]).max()) if finite.any() else float("nan")
    if not finite.all():
        raise ConfigError(f"image {image_ids[bad]}: the encoder gave non-finite features; nothing was written for it")
    raise ConfigError(
        f"image {image_ids[bad]}: a feature of magnitude {largest:g} overflows --dtype {dtype} "
        f"(at most {float(np.finfo(dtype).max):g}); extract with --dtype float32"
    )


def extract_from_config(
    config: PathLike,
    out_dir: PathLike,
    batch_size: int = 64,
    num_workers: int = 0,
    shard: tuple[int, int] = (0, 1),
    overrides: Sequence[str] = (),
    device: str | None = None,
    progress: bool = True,
    dtype: str = "float16",
    pool: int | None = None,
) -> dict:
    """Extract the features of every image of the config's annotation file (``overrides``: more
    ``--data.x`` / ``--model.x`` arguments, as for fit). ``dtype`` and ``pool`` as for
    :func:`extract_features`; ``pool`` is the encoder's own ``grid_size`` (its adaptive pooling),
    which a model trained on the cache sets too. Returns extract_features' report."""
    check_dtype(dtype), check_pool(pool)
    if not os.path.isfile(config):
        from captioning.training.cli import configs_listing

        raise ConfigError(f"{config}: no such config file; the configs: {configs_listing()}")
    from captioning.training.cli import run_lightning_cli  # the config is read as fit reads it

    cli = run_lightning_cli(["--config", str(config), *overrides], run=False)
    encoder_config, data = cli.model.encoder_config, cli.datamodule
    if encoder_config.name == "small_cnn":
        raise ConfigError(
            f"{config}: model.encoder.name small_cnn is trained with the decoder; caching its features makes no sense"
        )
    if pool is not None:
        encoder_config = dataclasses.replace(encoder_config, grid_size=pool)  # checked by EncoderConfig
    meta = {
        "encoder": encoder_config.name,
        "grid_size": encoder_config.grid_size,
        "pretrained": encoder_config.pretrained,
        "interpolation": data.interpolation,
    }
    encoder = build_encoder(dataclasses.replace(encoder_config, channels_last=False))
    records = data.all_records()
    return extract_features(
        records,
        encoder,
        data.images_root,
        out_dir,
        data.image_size,
        batch_size,
        num_workers,
        shard,
        device,
        meta,
        progress,
        images=data.image_dataset,
        dtype=dtype,
        pool=pool,
    )
