"""A feature cache is checked against the run and against itself: another image size or encoder,
a part whose files do not hold the rows its index lists, or an index of the wrong shape is one line
of ConfigError naming the file or the setting, never an IndexError from a memmap."""

import shutil

import pytest
import torch

from captioning.data.datamodule import CaptionDataModule
from captioning.data.features.reader import FeatureCache
from captioning.data.features.writer import extract_features
from captioning.data.formats import load_records
from captioning.errors import ConfigError
from captioning.models.encoders import EncoderConfig, build_encoder
from tests.helpers import make_karpathy

SIZE = 32


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    data = make_karpathy(tmp_path_factory.mktemp("karpathy"), n_train=6, n_val=2, n_test=2)
    torch.manual_seed(0)
    encoder = build_encoder(EncoderConfig("resnet50", pretrained=False, grid_size=2)).eval()
    out = tmp_path_factory.mktemp("cache")
    extract_features(
        load_records(data),
        encoder,
        str(data.parent),
        out,
        SIZE,
        batch_size=4,
        progress=False,
        meta={"encoder": "resnet50", "grid_size": 2},
    )
    return data, out


def _copy(cache, tmp_path):
    target = tmp_path / "cache"
    shutil.copytree(cache, target)
    [index] = target.glob("*.index.json")
    return target, index


def _one_line(call) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_another_image_size_is_refused_by_the_data_module(cached):
    data, cache = cached
    dm = CaptionDataModule(
        str(data), features=str(cache), image_size=SIZE * 2, batch_size=2, num_workers=0, min_word_freq=1
    )
    message = _one_line(dm.feature_cache)
    assert "image_size 32" in message and "64" in message and str(cache) in message
    ok = CaptionDataModule(
        str(data), features=str(cache), image_size=SIZE, batch_size=2, num_workers=0, min_word_freq=1
    )
    assert ok.feature_cache().grid_shape == (4, 2048)


def test_another_encoder_or_grid_is_refused(cached):
    cache = FeatureCache(cached[1])
    cache.check(image_size=SIZE, encoder="resnet50", grid_size=2)  # the settings it was extracted with
    assert "encoder 'resnet50'" in _one_line(lambda: cache.check(encoder="vgg16"))
    assert "grid_size 2" in _one_line(lambda: cache.check(grid_size=14))


@pytest.mark.parametrize(
    "suffix, change", [(".f16", "truncate"), (".done", "truncate"), (".f16", "extend"), (".done", "delete")]
)
def test_part_files_that_do_not_match_the_index(cached, tmp_path, suffix, change):
    cache, index = _copy(cached[1], tmp_path)
    path = index.with_name(index.name.replace(".index.json", suffix))
    if change == "delete":
        path.unlink()
    else:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] if change == "truncate" else data + b"\0" * 64)
    message = _one_line(lambda: FeatureCache(cache))
    assert str(path) in message


@pytest.mark.parametrize(
    "content",
    [
        "[1, 2]",
        '{"image_ids": "abc", "grid": [4, 8]}',
        '{"image_ids": [1.5], "grid": [4, 8]}',
        '{"image_ids": [1], "grid": [4]}',
        '{"image_ids": [1], "grid": [0, 8]}',
        '{"image_ids": [',
        "[" * 100000,
    ],
)
def test_an_index_of_the_wrong_shape(cached, tmp_path, content):
    cache, index = _copy(cached[1], tmp_path)
    index.write_text(content)
    assert str(index) in _one_line(lambda: FeatureCache(cache))


def write_part(folder, k, n, ids, meta, grid=(4, 8)):
    """A complete cache part written by hand: its index, zero features, every row done."""
    import json

    import numpy as np

    base = folder / f"part-{k:03d}-of-{n:03d}"
    base.with_name(base.name + ".index.json").write_text(
        json.dumps({"image_ids": ids, "grid": list(grid), "dtype": "float16", "meta": meta})
    )
    np.zeros((len(ids), *grid), np.float16).tofile(str(base) + ".f16")
    np.ones(len(ids), np.uint8).tofile(str(base) + ".done")


def test_every_part_s_meta_is_read(tmp_path):
    """The settings are read from every part (before: from the last part only, so a part that did
    not record them hid those of the others)."""
    write_part(tmp_path, 0, 2, [1, 2], {"encoder": "resnet50", "grid_size": 2, "image_size": 32})
    write_part(tmp_path, 1, 2, [3], {})
    cache = FeatureCache(tmp_path)
    assert cache.meta == {"encoder": "resnet50", "grid_size": 2, "image_size": 32}
    assert "encoder 'resnet50', this run has 'vgg16'" in _one_line(lambda: cache.check(encoder="vgg16"))


@pytest.mark.parametrize(
    "setting, values",
    [("encoder", ("resnet50", "vgg16")), ("pretrained", (True, False)), ("interpolation", ("bilinear", "bicubic"))],
)
def test_parts_of_different_extractions(tmp_path, setting, values):
    write_part(tmp_path, 0, 2, [1, 2], {setting: values[0]})
    write_part(tmp_path, 1, 2, [3], {setting: values[1]})
    message = _one_line(lambda: FeatureCache(tmp_path))
    assert "part-001-of-002.index.json" in message and f"{setting} {values[1]!r}" in message
    assert "parts of different extractions" in message


def test_the_data_module_compares_the_model_s_encoder(tmp_path, cached):
    """Training compares the cache's encoder, grid and weights with the model's (models/spec.py's
    encoder settings, which the data module reads from the LightningModule in setup)."""
    from types import SimpleNamespace

    data = cached[0]
    cache = tmp_path / "cache"
    cache.mkdir()
    write_part(
        cache,
        0,
        1,
        list(range(10)),
        {"encoder": "resnet50", "grid_size": 2, "pretrained": False, "image_size": SIZE, "interpolation": "bilinear"},
    )

    def setup(**encoder):
        dm = CaptionDataModule(
            str(data), features=str(cache), image_size=SIZE, batch_size=2, num_workers=0, min_word_freq=1
        )
        spec = SimpleNamespace(
            encoder=EncoderConfig(**{"name": "resnet50", "grid_size": 2, "pretrained": False, **encoder})
        )
        dm.trainer = SimpleNamespace(lightning_module=SimpleNamespace(spec=spec))
        dm.setup("fit")

    setup()
    assert "encoder 'resnet50', this run has 'resnet101'" in _one_line(lambda: setup(name="resnet101"))
    assert "grid_size 2, this run has 7" in _one_line(lambda: setup(grid_size=7))
    assert "pretrained False, this run has True" in _one_line(lambda: setup(pretrained=True))
