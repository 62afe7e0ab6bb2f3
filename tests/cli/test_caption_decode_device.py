"""`captioning caption --decode-device cuda` and `Captioner.caption_files(decode_device=...)`, tested
on the CPU: refused in one line without CUDA; with the check made to accept (no GPU here), the JPEGs
go to the model as their bytes, are decoded by torchvision (on the CPU here) and resized by torch,
and the captions are the CPU route's."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from captioning.api import Captioner
from captioning.cli import main
from captioning.data import images as images_module

DECODE = ["--device", "cpu", "--num-beams", "1", "--max-new-tokens", "8"]


@pytest.fixture(scope="module")
def photos(tiny_shapes, tmp_path_factory) -> Path:
    """The tiny shapes' test images as JPEGs, one left a PNG, and a JPEG no decoder reads."""
    root = tmp_path_factory.mktemp("decode") / "photos"
    root.mkdir()
    for i, p in enumerate(sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))):
        if i == 0:
            shutil.copy(p, root / p.name)
        else:
            Image.open(p).convert("RGB").save(root / f"{p.stem}.jpg", quality=95)
    good = next(root.glob("*.jpg")).read_bytes()
    start = good.index(b"\xff\xda")
    (root / "zz_broken.jpg").write_bytes(good[: start + 20] + b"\xff\xc8" * 10 + b"\xff\xd9")
    return root


def _caption(checkpoint, *args) -> int:
    try:
        return main(["caption", *map(str, args), "--checkpoint", str(checkpoint), *DECODE])
    except SystemExit as exit:
        return exit.code


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """The GPU route, decoding with torchvision's CPU decoder: the option's check accepts ``cuda``."""
    real = images_module.check_decode_device

    def check(device, option="--decode-device", interpolation=None):
        if str(device).startswith("cuda"):
            real("cpu", option, interpolation)
            if interpolation is not None and interpolation not in images_module.DEVICE_RESIZES:
                return real("cuda", option, interpolation)  # the resize refusal (or no-CUDA) line
            return torch.device("cpu")
        return real(device, option, interpolation)

    monkeypatch.setattr(images_module, "check_decode_device", check)
    calls = []
    real_decode = images_module.decode_jpegs

    def counted(jpegs, names, device):
        calls.append(len(jpegs))
        return real_decode(jpegs, names, device)

    monkeypatch.setattr(images_module, "decode_jpegs", counted)
    return calls


def test_refused_without_cuda_in_one_line(tiny_checkpoint, photos, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _caption(tiny_checkpoint, photos, "--decode-device", "cuda") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --decode-device cuda: no CUDA GPU is available here; decode on the CPU (--decode-device cpu)"
    ]
    with pytest.raises(Exception, match="no CUDA GPU is available here"):
        next(Captioner.from_checkpoint(tiny_checkpoint).caption_files(photos, decode_device="cuda"))


def test_the_captions_are_the_cpu_route_s(tiny_checkpoint, photos, tmp_path, cpu_as_gpu, capsys):
    cpu, gpu = tmp_path / "cpu.jsonl", tmp_path / "gpu.jsonl"
    assert _caption(tiny_checkpoint, photos, "--out", cpu, "--batch-size", "3") == 1
    assert _caption(tiny_checkpoint, photos, "--out", gpu, "--batch-size", "3", "--decode-device", "cuda") == 1
    assert sum(cpu_as_gpu) == 7 + 1  # the 7 JPEGs of good images and the broken one went as bytes
    report = [line for line in capsys.readouterr().err.splitlines() if "could not be read" in line]
    assert len(report) == 2 and all("zz_broken.jpg" in line for line in report)
    want = [json.loads(line) for line in cpu.read_text().splitlines()]
    got = [json.loads(line) for line in gpu.read_text().splitlines()]
    assert [r["image"] for r in got] == [r["image"] for r in want] and len(got) == 9
    for g, w in zip(got, want):
        if "error" in w:
            assert "error" in g and "zz_broken.jpg" in g["error"]
        else:
            assert g["generated_text"] == w["generated_text"] and abs(g["score"] - w["score"]) < 0.05


def test_the_api_generator(tiny_checkpoint, photos, cpu_as_gpu):
    captioner = Captioner.from_checkpoint(tiny_checkpoint, device="cpu")
    want = list(captioner.caption_files(photos, batch_size=4, num_beams=1, max_new_tokens=8))
    got = list(captioner.caption_files(photos, batch_size=4, decode_device="cuda", num_beams=1, max_new_tokens=8))
    assert cpu_as_gpu and [r["image"] for r in got] == [r["image"] for r in want]
    assert [r.get("generated_text") for r in got] == [r.get("generated_text") for r in want]
    assert "error" in got[-1] and "zz_broken.jpg" in got[-1]["error"]


def test_not_with_onnx_or_focus(tiny_checkpoint, photos, cpu_as_gpu, capsys):
    assert _caption(tiny_checkpoint, photos, "--decode-device", "cuda", "--focus", "0,0,10,10") == 1
    assert "--decode-device cuda: decodes for the PyTorch model (not with --focus)" in capsys.readouterr().err
