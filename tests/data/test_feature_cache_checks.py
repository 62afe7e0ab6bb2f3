"""A feature cache is checked against the run and against itself: another image size or encoder,
a part whose files do not hold the rows its index lists, or an index of the wrong shape is one line
of ConfigError naming the file or the setting, never an IndexError from a memmap."""
import shutil

import pytest
import torch

from captioning.cli.extract import extract_features
from captioning.data.datamodule import CaptionDataModule
from captioning.data.features import FeatureCache
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
    extract_features(load_records(data), encoder, str(data.parent), out, SIZE, batch_size=4, progress=False,
                     meta={"encoder": "resnet50", "grid_size": 2})
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
    dm = CaptionDataModule(str(data), features=str(cache), image_size=SIZE * 2, batch_size=2, num_workers=0, min_word_freq=1)
    message = _one_line(dm.feature_cache)
    assert "image_size 32" in message and "64" in message and str(cache) in message
    ok = CaptionDataModule(str(data), features=str(cache), image_size=SIZE, batch_size=2, num_workers=0, min_word_freq=1)
    assert ok.feature_cache().grid_shape == (4, 2048)


def test_another_encoder_or_grid_is_refused(cached):
    cache = FeatureCache(cached[1])
    cache.check(image_size=SIZE, encoder="resnet50", grid_size=2)  # the settings it was extracted with
    assert "encoder 'resnet50'" in _one_line(lambda: cache.check(encoder="vgg16"))
    assert "grid_size 2" in _one_line(lambda: cache.check(grid_size=14))


@pytest.mark.parametrize("suffix, change", [(".f16", "truncate"), (".done", "truncate"), (".f16", "extend"), (".done", "delete")])
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


@pytest.mark.parametrize("content", ['[1, 2]', '{"image_ids": "abc", "grid": [4, 8]}', '{"image_ids": [1.5], "grid": [4, 8]}',
                                     '{"image_ids": [1], "grid": [4]}', '{"image_ids": [1], "grid": [0, 8]}', '{"image_ids": [', '[' * 100000])
def test_an_index_of_the_wrong_shape(cached, tmp_path, content):
    cache, index = _copy(cached[1], tmp_path)
    index.write_text(content)
    assert str(index) in _one_line(lambda: FeatureCache(cache))
