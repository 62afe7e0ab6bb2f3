"""Feature caches at scale: the stored dtype (float16 or float32), a pooled grid, the model's grid
checked against the cache's, rows read without mapping the file (the memory of a process reading a
cache stays far below the cache's size), and caches of earlier versions still read."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning import compat
from captioning.cli import main
from captioning.data.datamodule import CaptionDataModule
from captioning.data.features.reader import FeatureCache
from captioning.data.features.writer import extract_features, pool_grid
from captioning.data.formats import load_records
from captioning.errors import ConfigError
from captioning.models.encoders import EncoderConfig, build_encoder
from captioning.training.cli import run_lightning_cli
from tests.helpers import make_karpathy

SIZE = 32
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "feature_cache_6af4865"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_karpathy(tmp_path_factory.mktemp("karpathy"), n_train=6, n_val=2, n_test=2)


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    return build_encoder(EncoderConfig("resnet50", pretrained=False, grid_size=2)).eval()


def extract(data, encoder, out, **kw):
    return extract_features(
        load_records(data), encoder, str(data.parent), out, SIZE, batch_size=4, progress=False, **kw
    )


@pytest.fixture(scope="module")
def caches(data, encoder, tmp_path_factory):
    """The same images extracted three ways: float16 (the default), float32, and pooled to 1x1."""
    out = {}
    for name, kw in (("f16", {}), ("f32", {"dtype": "float32"}), ("pool1", {"dtype": "float32", "pool": 1})):
        out[name] = tmp_path_factory.mktemp(name)
        report = extract(data, encoder, out[name], **kw)
        assert report["done"] == report["rows"] == 10
    return out


def _one_line(call) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_float32_and_float16_caches_hold_the_same_features(caches):
    f16, f32 = FeatureCache(caches["f16"]), FeatureCache(caches["f32"])
    assert (f16.dtype, f32.dtype) == ("float16", "float32")
    assert os.path.getsize(caches["f32"] / "part-000-of-001.f32") == 10 * 4 * 2048 * 4 == f32.nbytes
    assert os.path.getsize(caches["f16"] / "part-000-of-001.f16") == f16.nbytes == f32.nbytes // 2
    for image_id in f32.ids.tolist():
        full, half = f32[image_id], f16[image_id]
        assert full.dtype == torch.float32 and half.dtype == torch.float16 and full.shape == half.shape == (4, 2048)
        assert full.abs().max() > 0
        torch.testing.assert_close(half, full.half())  # float16 is float32 rounded, nothing else
    maps = f32.arrays()  # the data files are bare arrays: memory-mappable as they are
    assert len(maps) == 1 and maps[0].shape == (10, 4, 2048)
    np.testing.assert_array_equal(maps[0][int(f32.row_of[0])], f32[int(f32.ids[0])].numpy())


def test_a_pooled_cache_averages_the_grid_and_records_it(caches):
    full, pooled = FeatureCache(caches["f32"]), FeatureCache(caches["pool1"])
    assert pooled.grid_shape == (1, 2048) and pooled.nbytes == full.nbytes // 4
    assert pooled.meta["grid_size"] == 1 and pooled.meta["pool"] == 1
    for image_id in full.ids.tolist():
        torch.testing.assert_close(pooled[image_id][0], full[image_id].mean(0), rtol=1e-5, atol=1e-6)
    grid = torch.arange(2 * 16 * 3, dtype=torch.float32).reshape(2, 16, 3)  # a 4x4 grid of 3 channels
    two = pool_grid(grid, 2)
    assert two.shape == (2, 4, 3)
    torch.testing.assert_close(two[0, 0], grid[0, [0, 1, 4, 5]].mean(0))  # the top-left 2x2 cell, row-major
    assert pool_grid(grid, 4) is grid


def test_dtype_pool_and_resume_are_checked(data, encoder, caches, tmp_path):
    assert "--dtype float64" in _one_line(lambda: extract(data, encoder, tmp_path / "a", dtype="float64"))
    assert "--pool 0" in _one_line(lambda: extract(data, encoder, tmp_path / "b", pool=0))
    copy = tmp_path / "copy"
    shutil.copytree(caches["f16"], copy)
    message = _one_line(lambda: extract(data, encoder, copy, dtype="float32"))  # resuming it as float32
    assert "written with --dtype float16, this run has float32" in message
    assert "or --pool" in _one_line(lambda: extract(data, encoder, copy, pool=1))


def test_a_feature_float16_cannot_hold_is_refused(data, tmp_path):
    class Loud(torch.nn.Module):
        def forward(self, images):
            return torch.full((images.size(0), 4, 8), 1e6)

    message = _one_line(lambda: extract(data, Loud(), tmp_path / "loud"))
    assert "magnitude 1e+06 overflows --dtype float16" in message and "--dtype float32" in message
    report = extract(data, Loud(), tmp_path / "loud32", dtype="float32")
    assert report["done"] == 10 and float(FeatureCache(tmp_path / "loud32")[0][0, 0]) == 1e6


def test_a_cache_of_an_earlier_version_still_reads():
    """tests/fixtures/feature_cache_6af4865 was written by the writer of commit 6af4865."""
    cache = FeatureCache(FIXTURE)
    assert cache.dtype == "float16" and cache.grid_shape == (4, 8) and cache.ids.tolist() == [5, 7, 9]
    for r, image_id in enumerate((5, 7, 9)):
        expected = (np.arange(32, dtype=np.float32).reshape(4, 8) / 8 + r).astype(np.float16)
        np.testing.assert_array_equal(cache[image_id].numpy(), expected)
    cache.check(image_size=32, encoder="resnet50", grid_size=2, interpolation="bilinear", pretrained=False)


def test_an_index_that_records_no_dtype_reads_as_float16(tmp_path):
    for name in os.listdir(FIXTURE):
        shutil.copy(FIXTURE / name, tmp_path / name)
    index = tmp_path / "part-000-of-001.index.json"
    plain = json.loads(index.read_text())
    plain.pop("dtype")
    index.write_text(json.dumps(plain))
    cache = FeatureCache(tmp_path)
    assert cache.dtype == compat.UNRECORDED_FEATURE_DTYPE == "float16"
    assert cache[7].dtype == torch.float16 and float(cache[7][0, 1]) == 1.125
    plain["dtype"] = "int8"
    index.write_text(json.dumps(plain))
    assert '"dtype" must be one of float16, float32' in _one_line(lambda: FeatureCache(tmp_path))


# ---------------------------------------------------------------------- the model's grid
def write_config(path: Path, data: Path) -> Path:
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "flickr8k_soft.yaml").read_text())
    cfg["model"]["encoder"].update(name="resnet50", pretrained=False, grid_size=2)
    cfg["data"].update(annotations=str(data), images_root=str(data.parent), image_size=SIZE, pin_memory=False)
    path.write_text(yaml.safe_dump(cfg))
    return path


def fit_args(config, features, run, *more):
    return [
        "fit",
        "--config",
        str(config),
        "--data.features",
        str(features),
        "--data.batch_size",
        "4",
        "--data.num_workers",
        "0",
        "--data.min_word_freq",
        "1",
        "--trainer.default_root_dir",
        str(run),
        "--trainer.max_steps",
        "1",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.accelerator",
        "cpu",
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_checkpointing",
        "false",
        *more,
    ]


def test_cli_dtype_and_pool_then_the_model_must_match_the_grid(data, tmp_path, capsys):
    """extract-features --dtype float32 --pool 1 writes a 1x1 float32 cache; a model of a 2x2 grid
    is refused in one line before any step, a model of grid_size 1 trains on it; a float32 cache
    trains the model a float16 cache trains (the dtype is the cache's business)."""
    config = write_config(tmp_path / "cfg.yaml", data)
    pooled = tmp_path / "pooled"
    argv = ["extract-features", "--config", str(config), "--out", str(pooled), "--num-workers", "0"]
    assert main([*argv, "--dtype", "float32", "--pool", "1"]) == 0
    assert "10 of 10 images done" in capsys.readouterr().out
    index = json.loads((pooled / "part-000-of-001.index.json").read_text())
    assert index["dtype"] == "float32" and index["grid"] == [1, 2048]
    assert index["meta"]["grid_size"] == 1 and index["meta"]["pool"] == 1
    message = _one_line(lambda: run_lightning_cli(fit_args(config, pooled, tmp_path / "r1")))
    assert "features extracted with grid_size 1, this run has 2" in message
    cli = run_lightning_cli(fit_args(config, pooled, tmp_path / "r2", "--model.encoder.grid_size", "1"))
    assert cli.trainer.global_step == 1
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--pool", "0"])
    assert exit_.value.code == 2 and "argument --pool: expected a number >= 1, got 0" in capsys.readouterr().err


def test_the_model_s_grid_is_compared_with_the_cache_s(data, tmp_path):
    """A cache whose meta does not say its grid (written by hand, or before the grid was recorded):
    its (L, D) against the annotation vectors the model's encoder makes, one line either way."""
    config = write_config(tmp_path / "cfg.yaml", data)

    def cache(name, grid, dtype="float16"):
        folder = tmp_path / name
        folder.mkdir()
        ids = list(range(10))
        meta = {"image_size": SIZE, "interpolation": "bilinear"}
        index = {"image_ids": ids, "grid": list(grid), "dtype": dtype, "meta": meta}
        (folder / "part-000-of-001.index.json").write_text(json.dumps(index))
        np.ones((10, *grid), dtype).tofile(folder / f"part-000-of-001.{'f16' if dtype == 'float16' else 'f32'}")
        np.ones(10, np.uint8).tofile(folder / "part-000-of-001.done")
        return folder

    message = _one_line(lambda: run_lightning_cli(fit_args(config, cache("l9", (9, 2048)), tmp_path / "r1")))
    assert "features of 9 locations x 2048 (3x3 grid)" in message and "gives 4 x 2048" in message
    assert "--model.encoder.grid_size 3" in message
    message = _one_line(lambda: run_lightning_cli(fit_args(config, cache("d512", (4, 512)), tmp_path / "r2")))
    assert "features of 4 locations x 512" in message and "gives 4 x 2048" in message
    for dtype in ("float16", "float32"):
        cli = run_lightning_cli(fit_args(config, cache(dtype, (4, 2048), dtype), tmp_path / dtype))
        assert cli.trainer.global_step == 1


# ---------------------------------------------------------------------- memory
def _rss_mb(pid="self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _children() -> list[str]:
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids += f.read().split()
        except OSError:
            pass
    return pids


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the resident memory from /proc")
@pytest.mark.parametrize("workers", [0, 2])
def test_reading_a_whole_cache_keeps_memory_far_below_its_size(tmp_path, workers):
    """Every row of a 300 MB cache (written sparsely: no disk used) through the training loader: the
    resident memory of the main process and of each loader worker grows by less than a quarter of
    the cache (a memory-mapped read grows it by every page read)."""
    n, grid = 1500, (196, 512)  # 200 KB a row
    folder = tmp_path / "cache"
    folder.mkdir()
    meta = {"image_size": 224, "interpolation": "bilinear"}
    index = {"image_ids": list(range(n)), "grid": list(grid), "dtype": "float16", "meta": meta}
    (folder / "part-000-of-001.index.json").write_text(json.dumps(index))
    size = n * grid[0] * grid[1] * 2
    with open(folder / "part-000-of-001.f16", "wb") as f:
        f.truncate(size)  # sparse: reads give zeros
    np.ones(n, np.uint8).tofile(folder / "part-000-of-001.done")
    words = "a red circle on the left of blue square".split()
    images = [
        {"filepath": "img", "filename": f"{i}.jpg", "imgid": i, "split": "train" if i >= 20 else "val",
         "sentences": [{"tokens": words[: 3 + i % 6], "raw": " ".join(words[: 3 + i % 6])}]}
        for i in range(n)
    ]  # fmt: skip
    annotations = tmp_path / "dataset.json"
    annotations.write_text(json.dumps({"images": images}))
    dm = CaptionDataModule(str(annotations), features=str(folder), batch_size=32, num_workers=workers, min_word_freq=1)
    dm.setup("fit")
    loader = dm.train_dataloader()
    start, peak, workers_start, workers_peak, rows = _rss_mb(), 0.0, {}, {}, 0
    for batch in loader:
        rows += batch["features"].size(0)
        peak = max(peak, _rss_mb())
        for pid in _children():
            rss = _rss_mb(pid)
            workers_start.setdefault(pid, rss)
            workers_peak[pid] = max(workers_peak.get(pid, 0.0), rss)
    assert rows == n - 20  # every training row was read
    limit = size / 2**20 / 4
    assert peak - start < limit, f"the main process grew by {peak - start:.0f} MB reading a {size / 2**20:.0f} MB cache"
    if workers:
        assert len(workers_peak) == workers
        growth = max(workers_peak[p] - workers_start[p] for p in workers_peak)
        assert growth < limit, f"a loader worker grew by {growth:.0f} MB reading a {size / 2**20:.0f} MB cache"
