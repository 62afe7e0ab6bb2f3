"""The feature cache: extraction, resuming, sharding, reading in loaders and training from it."""

import json
from pathlib import Path

import pytest
import torch
import yaml

from captioning.cli import main
from captioning.data.datamodule import CaptionDataModule
from captioning.data.features.reader import FeatureCache
from captioning.data.features.writer import extract_features, parse_shard
from captioning.data.formats import load_records
from captioning.errors import ConfigError, ImageError
from captioning.models.encoders import EncoderConfig, build_encoder
from captioning.training.cli import run_lightning_cli
from tests.helpers import make_karpathy

SIZE = 32


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_karpathy(tmp_path_factory.mktemp("karpathy"), n_train=10, n_val=3, n_test=3)


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    return build_encoder(EncoderConfig("resnet50", pretrained=False, grid_size=2)).eval()


def extract(data, encoder, out, **kw):
    return extract_features(
        load_records(data), encoder, str(data.parent), out, SIZE, batch_size=4, progress=False, **kw
    )


@pytest.fixture(scope="module")
def full_cache(data, encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    report = extract(data, encoder, out)
    assert report["done"] == report["rows"] == 16 and not report["unreadable"]
    return out


def test_cache_holds_float16_grids_of_every_image(data, encoder, full_cache):
    cache = FeatureCache(full_cache)
    assert cache.grid_shape == (4, 2048) and len(cache) == 16
    record = load_records(data)[5]
    from captioning.data.images import load_image, to_tensor

    with torch.no_grad():
        expected = encoder(to_tensor(load_image(data.parent / record.path), SIZE)[None])[0]
    got = cache[record.image_id]
    assert got.dtype == torch.float16 and got.shape == (4, 2048)
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)
    with pytest.raises(ImageError, match="no features for image 999"):
        cache[999]


def test_interrupted_extraction_resumes_and_never_reads_half_written_rows(data, encoder, full_cache, tmp_path):
    first = extract(data, encoder, tmp_path, max_batches=2)  # "killed" after 2 batches
    assert first["done"] == first["extracted"] == 8
    cache = FeatureCache(tmp_path)
    ids = [r.image_id for r in load_records(data)]
    missing = cache.missing(ids)
    assert len(missing) == 8
    with pytest.raises(ImageError, match="incomplete"):
        cache[missing[0]]
    # a row whose data reached the file but whose done flag did not (killed in between): still refused
    import numpy as np

    part = str(next(tmp_path.glob("*.index.json")))[: -len(".index.json")]
    rows = json.loads(Path(part + ".index.json").read_text())["image_ids"]
    grids = np.memmap(part + ".f16", dtype=np.float16, mode="r+", shape=(len(rows), *cache.grid_shape))
    grids[rows.index(missing[0])] = 1.0
    grids.flush()
    del grids
    with pytest.raises(ImageError, match="incomplete"):
        FeatureCache(tmp_path)[missing[0]]
    second = extract(data, encoder, tmp_path)
    assert second["extracted"] == 8 and second["done"] == 16
    full = FeatureCache(full_cache)
    for i in ids:
        torch.testing.assert_close(FeatureCache(tmp_path)[i], full[i], rtol=2e-3, atol=2e-3)  # batch makeup differs
    assert extract(data, encoder, tmp_path)["extracted"] == 0  # nothing left to do


def test_resume_refuses_another_encoder_grid(data, full_cache):
    other = build_encoder(EncoderConfig("resnet50", pretrained=False, grid_size=3)).eval()
    with pytest.raises(ConfigError, match="another encoder grid"):
        extract(data, other, full_cache)


def test_shards_merge(data, encoder, full_cache, tmp_path):
    for i in range(3):
        extract(data, encoder, tmp_path, shard=(i, 3))
    assert len(list(tmp_path.glob("*.index.json"))) == 3
    merged, full = FeatureCache(tmp_path), FeatureCache(full_cache)
    assert len(merged) == 16 and not merged.missing(full.ids.tolist())
    for i in full.ids.tolist():
        torch.testing.assert_close(merged[i], full[i], rtol=2e-3, atol=2e-3)
    assert parse_shard("2/3") == (2, 3)
    with pytest.raises(ConfigError, match="0 <= i < n"):
        parse_shard("3/3")


@pytest.mark.parametrize("workers", [0, 2])
def test_datamodule_reads_features(data, full_cache, workers):
    dm = CaptionDataModule(
        str(data), features=str(full_cache), image_size=SIZE, batch_size=4, num_workers=workers, min_word_freq=1
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert (
        "images" not in batch and batch["features"].shape == (4, 4, 2048) and batch["features"].dtype == torch.float16
    )
    grouped = CaptionDataModule(
        str(data), features=str(full_cache), image_size=SIZE, batch_size=2, min_word_freq=1, group_captions=True
    )
    b = next(iter(grouped.train_dataloader()))  # 2 images with all 3 captions each: features once per image
    assert b["features"].shape == (2, 4, 2048) and b["captions"].size(0) == 6
    assert b["image_index"].tolist() == [0, 0, 0, 1, 1, 1]
    test = list(dm.test_dataloader())
    assert sum(len(b["image_ids"]) for b in test) == 3 and test[0]["features"].shape[1:] == (4, 2048)


def test_datamodule_refuses_incomplete_cache(data, encoder, tmp_path):
    extract(data, encoder, tmp_path, max_batches=1)
    dm = CaptionDataModule(str(data), features=str(tmp_path), image_size=SIZE, batch_size=4, min_word_freq=1)
    with pytest.raises(ConfigError, match="no complete features for .* of the 10 train images"):
        dm.train_dataloader()
    with pytest.raises(ConfigError, match="no such feature cache folder"):
        CaptionDataModule(str(data), features=str(tmp_path / "nope"))


def test_cache_memory_is_lazy(full_cache):
    cache = FeatureCache(full_cache)
    assert cache._files is None
    cache[cache.ids[0]]
    assert cache._files is not None
    import pickle

    clone = pickle.loads(pickle.dumps(cache))  # what a DataLoader worker gets: no open files
    assert clone._files is None and torch.equal(clone[cache.ids[0]], cache[cache.ids[0]])


def write_config(path: Path, data: Path) -> Path:
    cfg = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "flickr8k_soft.yaml").read_text())
    cfg["model"]["encoder"].update(name="resnet50", pretrained=False, grid_size=2)
    cfg["data"].update(annotations=str(data), images_root=str(data.parent), image_size=SIZE, pin_memory=False)
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_cli_extract_then_train_from_features(data, tmp_path, capsys):
    config = write_config(tmp_path / "cfg.yaml", data)
    out = tmp_path / "feats"
    assert (
        main(
            ["extract-features", "--config", str(config), "--out", str(out), "--batch-size", "8", "--num-workers", "0"]
        )
        == 0
    )
    assert "16 of 16 images done" in capsys.readouterr().out
    assert json.loads((out / "part-000-of-001.index.json").read_text())["meta"]["encoder"] == "resnet50"
    cli = run_lightning_cli(
        [
            "fit",
            "--config",
            str(config),
            "--data.features",
            str(out),
            "--data.batch_size",
            "4",
            "--data.num_workers",
            "0",
            "--data.min_word_freq",
            "1",
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            "--trainer.max_epochs",
            "1",
            "--trainer.max_steps",
            "2",
            "--trainer.limit_val_batches",
            "1",
            "--trainer.accelerator",
            "cpu",
            "--trainer.devices",
            "1",
            "--trainer.precision",
            "32",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger",
            "false",
            "--model.val_generation.max_new_tokens",
            "5",
            "--model.test_generation.max_new_tokens",
            "5",
        ]
    )
    assert cli.trainer.global_step == 2
    # a model whose encoder did not write the cache: one line naming the setting, before any step
    args = [
        "fit",
        "--config",
        str(config),
        "--data.features",
        str(out),
        "--data.num_workers",
        "0",
        "--data.min_word_freq",
        "1",
        "--trainer.default_root_dir",
        str(tmp_path / "run2"),
        "--trainer.max_steps",
        "1",
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.accelerator",
        "cpu",
    ]
    with pytest.raises(ConfigError, match="features extracted with grid_size 2, this run has 3"):
        run_lightning_cli(args + ["--model.encoder.grid_size", "3"])
    with pytest.raises(ConfigError, match="features extracted with encoder 'resnet50', this run has 'resnet101'"):
        run_lightning_cli(args + ["--model.encoder.name", "resnet101"])
    assert main(["extract-features", "--config", str(tmp_path / "none.yaml"), "--out", str(out)]) == 1


def test_resume_refuses_a_part_written_with_other_encoder_settings(data, encoder, tmp_path):
    """The same grid, another encoder name in the part's meta: resuming it is one line naming the setting."""
    extract(data, encoder, tmp_path, max_batches=1, meta={"encoder": "resnet50"})
    with pytest.raises(ConfigError, match="features extracted with encoder 'resnet50', this run has 'resnet101'"):
        extract(data, encoder, tmp_path, meta={"encoder": "resnet101"})


def test_a_part_cut_short_is_refused_not_zero_extended(data, encoder, tmp_path):
    """A part's data file cut (a full disk, a partial copy) is not mapped for writing (which would
    extend it with zeros, its rows then read as features with their done flags set): one line."""
    extract(data, encoder, tmp_path, max_batches=2)
    part = next(tmp_path.glob("*.f16"))
    size = part.stat().st_size
    with open(part, "r+b") as f:
        f.truncate(size // 3)
    with pytest.raises(ConfigError, match="cannot be resumed") as err:
        extract(data, encoder, tmp_path)
    assert "\n" not in str(err.value) and str(part) in str(err.value)
    assert part.stat().st_size == size // 3  # left as it was


@pytest.mark.parametrize(
    "index, rows, expected",
    [
        ({"image_ids": [2**70], "grid": [4, 8]}, 1, "outside the 64-bit integers"),
        ({"image_ids": [3, 3], "grid": [4, 8]}, 2, "lists an image twice"),
        ({"image_ids": [3], "grid": [1, 2**27]}, 1, "more than the 16,777,216 values a cache row may hold"),
        ({"image_ids": [3], "grid": [4, 8], "dtype": ["float16"]}, 1, '"dtype" must be one of'),
    ],
)
def test_an_index_no_reader_could_use_is_one_line(tmp_path, index, rows, expected):
    part = tmp_path / "part-000-of-001"
    grid = index["grid"]
    with open(f"{part}.f16", "wb") as f:
        f.truncate(rows * grid[0] * grid[1] * 2)  # sparse: the sizes agree with the index
    (tmp_path / "part-000-of-001.done").write_bytes(b"\x01" * rows)
    (tmp_path / "part-000-of-001.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=expected) as err:
        FeatureCache(tmp_path)
    assert "\n" not in str(err.value)
