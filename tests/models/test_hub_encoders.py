"""Backbones published on the Hugging Face Hub as the encoder (``timm:hf-hub:owner/name``,
``open_clip:hf-hub:owner/name``, or ``local-dir:PATH``): a tiny timm model saved by timm's own
``save_for_hf`` into huggingface_hub's cache layout on disk, read offline (HF_HUB_OFFLINE), nothing
downloaded. Safetensors only: a repository whose weights are a pickle is refused in one line before
anything is read."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captioning.errors import ConfigError
from captioning.models.encoders import EncoderConfig, build_encoder
from captioning.models.spec import encoder_interpolation
from tests.helpers import ROOT, fit_args

timm = pytest.importorskip("timm", reason="the ecosystem extra: pip install -e '.[ecosystem]'")
huggingface_hub = pytest.importorskip("huggingface_hub")

REVISION = "0123456789abcdef0123456789abcdef01234567"
MEAN, STD = (0.25, 0.5, 0.75), (0.2, 0.3, 0.4)


def save_hub_model(cache: Path, repo: str, safetensors: bool = True, seed: int = 0) -> torch.nn.Module:
    """timm's ``test_resnet`` (0.4 M parameters) saved by ``timm.models.save_for_hf`` as the snapshot of
    ``repo`` in the huggingface_hub cache ``cache`` (what a download leaves there), with its own
    normalisation and resize in the pretrained configuration."""
    torch.manual_seed(seed)
    net = timm.create_model("test_resnet", num_classes=10, pretrained_cfg_overlay={"mean": MEAN, "std": STD,
                            "interpolation": "bicubic"})  # fmt: skip
    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / REVISION
    timm.models.save_for_hf(net, snapshot, safe_serialization=safetensors or False)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(REVISION)
    return net


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline huggingface_hub cache in tmp_path (the environment's, for subprocesses, too)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _same_weights(encoder, net) -> bool:
    theirs = {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    ours = {k.removeprefix("net."): v for k, v in encoder.state_dict().items() if k.startswith("net.")}
    return set(theirs) == set(ours) and all(torch.equal(theirs[k], ours[k]) for k in theirs)


@pytest.mark.parametrize("form", ["hf-hub", "local-dir"])
def test_a_hub_backbone_loads_its_safetensors_and_its_preprocessing(hub_cache, form):
    net = save_hub_model(hub_cache, "someone/tiny-resnet")
    model = "hf-hub:someone/tiny-resnet"
    if form == "local-dir":  # the same files in a folder of one's own
        model = f"local-dir:{hub_cache / 'models--someone--tiny-resnet' / 'snapshots' / REVISION}"
    config = EncoderConfig(f"timm:{model}")
    encoder = build_encoder(config)
    assert _same_weights(encoder, net)  # the Hub's weights, frozen
    assert not any(p.requires_grad for p in encoder.parameters())
    assert encoder.preprocessing["mean"] == pytest.approx(MEAN) and encoder.preprocessing["std"] == pytest.approx(STD)
    assert encoder.preprocessing["interpolation"] == "bicubic" == encoder_interpolation(config)
    assert encoder(torch.rand(2, 3, 64, 64)).shape == (2, 4, net.num_features)  # 64 px / 32 -> 2 x 2
    fresh = build_encoder(EncoderConfig(f"timm:{model}", pretrained=False))  # the architecture only
    assert not _same_weights(fresh, net) and fresh.preprocessing == encoder.preprocessing


def test_a_pickle_only_backbone_is_refused_in_one_line_before_it_is_read(hub_cache, monkeypatch):
    save_hub_model(hub_cache, "someone/pickled", safetensors=False)
    assert (hub_cache / "models--someone--pickled" / "snapshots" / REVISION / "pytorch_model.bin").is_file()

    def no_unpickling(*args, **kwargs):
        raise AssertionError("a pickle was read")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(ConfigError) as info:
        build_encoder(EncoderConfig("timm:hf-hub:someone/pickled"))
    message = str(info.value)
    assert "\n" not in message and message.startswith("model.encoder.name timm:hf-hub:someone/pickled: ")
    assert "pytorch_model.bin, a pickle" in message and "refused" in message
    build_encoder(EncoderConfig("timm:hf-hub:someone/pickled", pretrained=False))  # its architecture is fine


@pytest.mark.parametrize(
    "name, expected",
    [
        ("timm:hf-hub:someone/missing", "config.json of someone/missing is not in the Hugging Face cache"),
        ("timm:hf-hub:not a repo", "expected hf-hub:owner/name"),
        ("timm:local-dir:/no/such/folder", "/no/such/folder/config.json: no such file"),
        ("open_clip:hf-hub:someone/missing", "open_clip_config.json of someone/missing is not in the"),
    ],
)
def test_hub_names_that_cannot_load_are_one_line(hub_cache, name, expected):
    if name.startswith("open_clip"):
        pytest.importorskip("open_clip", reason="the ecosystem extra: pip install -e '.[ecosystem]'")
    with pytest.raises(ConfigError) as info:
        build_encoder(EncoderConfig(name))
    assert "\n" not in str(info.value) and expected in str(info.value)


def test_an_open_clip_hub_tower_loads_its_safetensors(hub_cache):
    """An OpenCLIP model in the Hub layout (open_clip_config.json, open_clip_model.safetensors): its image
    tower with the saved weights and preprocessing; the text tower's weights are read and unused."""
    open_clip = pytest.importorskip("open_clip", reason="the ecosystem extra: pip install -e '.[ecosystem]'")
    from safetensors.torch import save_file

    model_cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 1, "layers": 1},
    }
    torch.manual_seed(0)
    clip = open_clip.CLIP(**model_cfg)
    folder = hub_cache / "models--someone--tiny-clip"
    snapshot = folder / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    preprocess = {"mean": list(MEAN), "std": list(STD), "interpolation": "bicubic"}
    (snapshot / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": preprocess}))
    save_file({k: v.contiguous() for k, v in clip.state_dict().items()}, snapshot / "open_clip_model.safetensors")
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(REVISION)
    config = EncoderConfig("open_clip:hf-hub:someone/tiny-clip")
    encoder = build_encoder(config)
    visual = {k: v for k, v in clip.visual.state_dict().items() if k != "proj"}
    ours = {k.removeprefix("visual."): v for k, v in encoder.state_dict().items() if k.startswith("visual.")}
    assert set(visual) <= set(ours) and all(torch.equal(visual[k], ours[k]) for k in visual)
    assert encoder.preprocessing["mean"] == pytest.approx(MEAN) and encoder.input_size == (32, 32)
    assert encoder_interpolation(config) == "bicubic"
    assert encoder(torch.rand(1, 3, 32, 32)).shape == (1, 4, 32)  # 32 px / 16 -> 2 x 2, width 32
    # CLIPScore with the same model: the whole CLIP's weights, OpenCLIP's tokenizer for it
    from PIL import Image

    from captioning.metrics.clip_score import ClipScorer

    scorer = ClipScorer.load("hf-hub:someone/tiny-clip")
    assert all(torch.equal(v, scorer.model.state_dict()[k]) for k, v in clip.state_dict().items())
    scores = scorer([Image.new("RGB", (40, 40), (200, 20, 20))], ["a red square"], [["a red block"]])
    assert set(scores) == {"CLIPScore", "RefCLIPScore"} and 0 <= scores["CLIPScore"] <= 2.5


@pytest.mark.slow  # a training run and a captioning run in subprocesses (about a minute on 2 cores)
def test_a_hub_backbone_trains_and_captions_offline_from_the_cache(hub_cache, tmp_path, tiny_shapes):
    """What a user does with a fine-tuned backbone of the Hub: train with it, then caption with the
    checkpoint, offline, from the local copy (the cache); the weights never leave safetensors."""
    save_hub_model(hub_cache, "someone/tiny-resnet")
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "captioning.cli"]
    args = fit_args(
        tiny_shapes, tmp_path / "run", steps=3, extra=["--model.encoder.name", "timm:hf-hub:someone/tiny-resnet"]
    )
    done = subprocess.run(cli + [str(a) for a in args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [checkpoint] = (tmp_path / "run").rglob("last.ckpt")
    image = next(Path(tiny_shapes).parent.rglob("*.png"))
    caption = [*cli, "caption", str(image), "--checkpoint", str(checkpoint), "--json"]
    done = subprocess.run(caption, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [out] = json.loads(done.stdout)
    assert out["image"] == str(image) and out["generated_text"].strip()
