"""JPEGs decoded on the GPU (``--data.decode_device cuda``, ``caption --decode-device cuda``), tested
on the CPU: the loader hands each JPEG's bytes to the main process, which decodes them with
torchvision's decoder (here on the CPU; nvJPEG on a GPU) and resizes them with torch's antialiased
filter. The images equal the CPU route's (Pillow) within a level of 255; what the device route does
not read as Pillow does goes the CPU route; unreadable JPEGs are dropped and reported as before; the
option is refused in one line where there is no CUDA GPU."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.data import images as images_module
from captioning.data.datamodule import CaptionDataModule
from captioning.data.images import (
    check_decode_device,
    decode_batch,
    drop_rows,
    jpeg_file_bytes,
    load_image,
    pack_jpegs,
    pixels_to_float,
    resize_on_device,
    to_pixels,
)
from captioning.errors import ConfigError
from tests.helpers import fit_args, make_karpathy

SIZE = 32
CPU = torch.device("cpu")


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _one_line(call) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_the_option_is_refused_without_cuda_in_one_line(no_cuda, tmp_path):
    assert check_decode_device("cpu") is None and check_decode_device(None) is None
    message = _one_line(lambda: check_decode_device("cuda"))
    assert message == "--decode-device cuda: no CUDA GPU is available here; decode on the CPU (--decode-device cpu)"
    assert "expected cpu or cuda" in _one_line(lambda: check_decode_device("gpu"))
    assert "CPU (cpu) or a CUDA GPU" in _one_line(lambda: check_decode_device("meta"))
    data = make_karpathy(tmp_path, n_train=2, n_val=1, n_test=1)
    message = _one_line(lambda: CaptionDataModule(str(data), decode_device="cuda"))
    assert message.startswith("data.decode_device cuda: no CUDA GPU is available here")


def test_resizes_the_device_route_does_not_reproduce_are_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_decode_device("cuda", interpolation="bicubic") == torch.device("cuda")
    assert "resizes with lanczos" in _one_line(lambda: check_decode_device("cuda", interpolation="lanczos"))
    assert "has 1 CUDA GPU" in _one_line(lambda: check_decode_device("cuda:3"))


@pytest.mark.parametrize("interpolation, worst", [("bilinear", 1), ("bicubic", 3)])
@pytest.mark.parametrize("size", [24, 32, 80])
def test_decode_and_resize_equal_the_cpu_route(tmp_path, interpolation, worst, size):
    """torchvision's decoder and torch's antialiased resize against Pillow's (the CPU route), down and up."""
    y, x = np.mgrid[0:120, 0:160].astype(np.float32)
    pixels = np.stack([np.sin(x / 9) * 90 + 128, np.cos(y / 7) * 90 + 128, (x + y) / 1.2], -1)
    pixels = np.clip(pixels + np.random.default_rng(0).normal(0, 15, pixels.shape), 0, 255).astype(np.uint8)
    path = tmp_path / "a.jpg"
    Image.fromarray(pixels).save(path, quality=90)
    data = jpeg_file_bytes(path)
    assert data is not None and data.dtype == torch.uint8 and data.dim() == 1
    [decoded], [error] = images_module.decode_jpegs([data], [str(path)], CPU)
    assert error is None
    cpu = to_pixels(load_image(path), size, interpolation).astype(int)
    device = resize_on_device(decoded, size, interpolation).numpy().astype(int)
    diff = np.abs(device - cpu)
    assert diff.max() <= worst and diff.mean() < 0.35, (diff.max(), diff.mean())


def test_what_the_device_route_would_read_otherwise_goes_the_cpu_route(tmp_path):
    base = Image.fromarray(np.random.default_rng(1).integers(0, 255, (40, 50, 3), dtype=np.uint8))
    base.save(tmp_path / "plain.jpg")
    assert jpeg_file_bytes(tmp_path / "plain.jpg") is not None
    base.convert("L").save(tmp_path / "grey.jpg")
    assert jpeg_file_bytes(tmp_path / "grey.jpg") is not None
    base.save(tmp_path / "png.png")
    assert jpeg_file_bytes(tmp_path / "png.png") is None  # another format
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the device decoder ignores EXIF
    base.save(tmp_path / "rotated.jpg", exif=exif)
    assert jpeg_file_bytes(tmp_path / "rotated.jpg") is None
    base.convert("CMYK").save(tmp_path / "cmyk.jpg")
    assert jpeg_file_bytes(tmp_path / "cmyk.jpg") is None
    whole = (tmp_path / "plain.jpg").read_bytes()
    (tmp_path / "truncated.jpg").write_bytes(whole[: len(whole) // 2])
    assert jpeg_file_bytes(tmp_path / "truncated.jpg") is None  # the CPU route says what is wrong with it
    shutil.copy(tmp_path / "plain.jpg", tmp_path / "named.png")
    assert jpeg_file_bytes(tmp_path / "named.png") is None


def _data(tmp_path):
    """A Karpathy file of JPEGs, with a PNG, an EXIF-rotated JPEG and a JPEG whose data is damaged
    between intact markers among the training images."""
    data = make_karpathy(tmp_path, n_train=10, n_val=3, n_test=3)
    folder = data.parent / "images"
    Image.open(folder / "1.jpg").save(folder / "1.png")
    exif = Image.Exif()
    exif[0x0112] = 3
    Image.open(folder / "2.jpg").save(folder / "2r.jpg", exif=exif)
    good = (folder / "3.jpg").read_bytes()
    start = good.index(b"\xff\xda")  # the scan: markers no decoder accepts in place of the entropy-coded data
    (folder / "3.jpg").write_bytes(good[: start + 20] + b"\xff\xc8" * 10 + b"\xff\xd9")
    spec = json.loads(data.read_text())
    spec["images"][1]["filename"], spec["images"][2]["filename"] = "1.png", "2r.jpg"
    data.write_text(json.dumps(spec))
    return data


def _batches(dm, split, device_route: bool):
    dm.setup("fit")
    if device_route:
        dm.decode_device = CPU  # the GPU route, decoding with torchvision's CPU decoder
    loader = dm.train_dataloader() if split == "train" else dm.eval_dataloader(split)
    return [dm.on_before_batch_transfer(batch, 0) for batch in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_training_loader_hands_jpeg_bytes_to_the_decoder(tmp_path, workers):
    data = _data(tmp_path)

    def module(**kw):
        return CaptionDataModule(
            str(data), image_size=SIZE, batch_size=4, num_workers=workers, min_word_freq=1, on_bad_image="skip", **kw
        )

    torch.manual_seed(0)
    device = _batches(module(), "train", True)
    torch.manual_seed(0)
    cpu = _batches(module(), "train", False)
    seen = set()
    for got, want in zip(device, cpu, strict=True):
        # the damaged JPEG: the CPU route's worker drops it, the device route's main process
        keep = torch.isin(want["image_ids"], got["image_ids"])
        assert torch.equal(got["image_ids"], want["image_ids"][keep])
        assert torch.equal(got["captions"], want["captions"][keep][:, : got["captions"].size(1)])
        assert got["images"].shape == (len(got["image_ids"]), 3, SIZE, SIZE) and got["images"].dtype == torch.float32
        diff = (got["images"] - want["images"][keep]).abs() * 255
        assert diff.max() <= 1.0 + 1e-3 and diff.mean() < 0.35
        seen.update(got["image_ids"].tolist())
    assert 3 not in seen and {0, 1, 2, 4}.issubset(seen)  # the PNG and the rotated JPEG went the CPU route


def test_a_whole_batch_of_raw_jpegs_and_a_bad_one_among_them(tmp_path):
    data = _data(tmp_path)
    dm = CaptionDataModule(str(data), image_size=SIZE, batch_size=16, min_word_freq=1, on_bad_image="skip")
    dm.setup("fit")
    dm.decode_device = CPU
    dataset = dm._dataset(type(dm.train_dataloader().dataset), "train", vocab=dm.vocab, max_length=dm.max_length)
    collate = dm.train_dataloader().collate_fn
    batch = collate([dataset[i] for i in range(len(dataset))])
    # 3 captions an image: the 8 JPEG files' 24 pairs as bytes, the PNG's and the rotated JPEG's 6 decoded
    assert len(batch["jpeg_rows"]) == 24 and batch["images"].shape[0] == 6
    assert batch["jpeg"].dtype == torch.uint8 and len(batch["jpeg_offsets"]) == 25
    out = dm.on_before_batch_transfer(batch, 0)
    assert 3 not in out["image_ids"].tolist() and len(out["image_ids"]) == len(out["captions"]) == 27
    assert dm.skipped_samples == 3
    dm.on_bad_image = "error"
    batch = collate([dataset[i] for i in range(len(dataset))])
    with pytest.raises(Exception, match="3.jpg: unreadable image"):
        dm.on_before_batch_transfer(batch, 0)


def test_dropping_rows_keeps_each_caption_with_its_image():
    images, ids = torch.arange(4.0).view(4, 1), torch.tensor([10, 11, 12, 13])
    grouped = {
        "images": images,
        "image_ids": ids,
        "image_index": torch.tensor([0, 0, 1, 2, 2, 3]),
        "captions": torch.arange(6).view(6, 1),
        "lengths": torch.arange(6),
    }
    out = drop_rows(grouped, [1], 4)
    assert out["image_ids"].tolist() == [10, 12, 13] and out["images"].view(-1).tolist() == [0.0, 2.0, 3.0]
    assert out["image_index"].tolist() == [0, 0, 1, 1, 2] and out["captions"].view(-1).tolist() == [0, 1, 3, 4, 5]
    pairs = {"images": images, "image_ids": ids, "captions": torch.arange(4).view(4, 1), "lengths": torch.arange(4)}
    assert drop_rows(pairs, [0, 3], 4)["captions"].view(-1).tolist() == [1, 2]


def test_pack_and_decode_keep_batch_order(tmp_path):
    paths = []
    for i in range(3):
        path = tmp_path / f"{i}.jpg"
        Image.fromarray(np.full((20, 30, 3), 40 * i + 20, np.uint8)).save(path, quality=95)
        paths.append(path)
    pixels = torch.from_numpy(pixels_to_float(to_pixels(load_image(paths[1]), 8)))
    batch = pack_jpegs([jpeg_file_bytes(paths[0]), pixels, jpeg_file_bytes(paths[2])], [str(p) for p in paths])
    assert batch["jpeg_rows"].tolist() == [0, 2] and batch["image_rows"].tolist() == [1]
    out = decode_batch(batch, CPU, 8)["images"]
    levels = (out.mean((1, 2, 3)) * 255).round().tolist()
    assert [abs(a - b) <= 2 for a, b in zip(levels, [20, 60, 100])] == [True, True, True]


def test_fit_decodes_the_jpegs_in_the_main_process(tmp_path, monkeypatch):
    """The Lightning route: with the option's check made to accept (no GPU here), fit decodes every
    training batch through the data module's hook, with torchvision's CPU decoder."""
    from captioning.data import captions as captions_module
    from captioning.data import datamodule as datamodule_module
    from captioning.training.cli import run_lightning_cli

    data = make_karpathy(tmp_path, n_train=8, n_val=2, n_test=2)
    calls = []
    real_decode = datamodule_module.decode_batch

    def counted(batch, device, *args):
        calls.append(("jpeg_rows" in batch, device))
        return real_decode(batch, device, *args)

    monkeypatch.setattr(captions_module, "check_decode_device", lambda *a, **k: CPU)
    monkeypatch.setattr(datamodule_module, "decode_batch", counted)
    args = fit_args(
        data,
        tmp_path / "run",
        extra=["--data.decode_device", "cuda", "--data.min_word_freq", "1", "--data.cache_images", "false"],
    )
    cli = run_lightning_cli(args)
    assert cli.trainer.global_step == 2
    assert len(calls) >= 2 and all(raw and device == CPU for raw, device in calls)
