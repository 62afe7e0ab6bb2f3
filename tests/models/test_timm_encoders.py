"""timm and OpenCLIP backbones as the grid encoder (random weights: ``pretrained false``, nothing downloaded).

Each backbone trains a few steps on the tiny shapes data, then its checkpoint evaluates, exports to a
model folder that captions, and its frozen grids go to a feature cache.
"""

import json
from pathlib import Path

import pytest
import torch
import yaml

from captioning.cli import main
from captioning.errors import CheckpointError, ConfigError
from captioning.models.encoders import EncoderConfig, build_encoder
from tests.helpers import ROOT, fit_args

pytest.importorskip("timm", reason="the ecosystem extra: pip install -e '.[ecosystem]'")
pytest.importorskip("open_clip", reason="the ecosystem extra: pip install -e '.[ecosystem]'")

# (name, image size, grid side): ViTs on their patch grid, OpenCLIP at its fixed 224 px
BACKBONES = [("timm:resnet18", 64, 2), ("timm:vit_tiny_patch16_224", 64, 4), ("open_clip:ViT-B-32", 224, 7)]


@pytest.mark.parametrize("name,size,side", BACKBONES)
def test_grid_shape_preprocessing_and_frozen_body(name, size, side):
    encoder = build_encoder(EncoderConfig(name, pretrained=False, fine_tune_blocks=1))
    grid = encoder(torch.rand(2, 3, size, size))
    assert grid.shape == (2, side * side, encoder.out_dim)
    assert set(encoder.preprocessing) == {"mean", "std", "interpolation", "input_size"}
    assert encoder.mean.flatten().tolist() == pytest.approx(encoder.preprocessing["mean"])
    trainable = [n for n, p in encoder.named_parameters() if p.requires_grad]
    frozen = [n for n, p in encoder.named_parameters() if not p.requires_grad]
    assert trainable and frozen  # the top block only
    none = build_encoder(EncoderConfig(name, pretrained=False))
    assert not any(p.requires_grad for p in none.parameters())


def test_vit_patch_grid_follows_the_image_size():
    encoder = build_encoder(EncoderConfig("timm:vit_tiny_patch16_224", pretrained=False))
    assert encoder(torch.rand(1, 3, 96, 96)).shape == (1, 36, 192)  # (96 / 16)^2 patches, class token dropped
    registers = build_encoder(EncoderConfig("timm:vit_betwixt_patch16_reg4_gap_256", pretrained=False)).eval()
    assert registers.net.num_prefix_tokens == 4  # 4 register tokens, dropped
    with torch.no_grad():
        assert registers(torch.rand(1, 3, 64, 64)).shape == (1, 16, 640)


def test_swin_takes_any_size_too():
    swin = build_encoder(EncoderConfig("timm:swin_tiny_patch4_window7_224", pretrained=False)).eval()
    assert swin.input_size is None
    with torch.no_grad():
        assert swin(torch.rand(1, 3, 64, 64)).shape == (1, 4, 768)  # the last stage: stride 32, NCHW from NHWC


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(
    "name,expected",
    [
        ("timm:resnet1800", "timm has no model 'resnet1800'; list the names with"),
        ("open_clip:ViT-Q-99", "OpenCLIP has no model 'ViT-Q-99'"),
        ("open_clip:ViT-B-32/no_such_tag", "no pretrained tag 'no_such_tag'"),
        ("dino", "timm:<model> or open_clip:<model>"),
    ],
)
def test_bad_names_are_one_line(name, expected):
    with pytest.raises(ConfigError) as err:
        EncoderConfig(name)
    assert expected in one_line(err)


def test_open_clip_size_mismatch_is_one_line():
    encoder = build_encoder(EncoderConfig("open_clip:ViT-B-32", pretrained=False))
    with pytest.raises(ConfigError) as err:
        encoder(torch.rand(1, 3, 64, 64))
    assert one_line(err) == "open_clip:ViT-B-32 takes 224x224 images, got 64x64: set --data.image_size 224"


def test_local_weights_safetensors_and_pickles(tmp_path):
    from safetensors.torch import save_file

    source = build_encoder(EncoderConfig("timm:resnet18", pretrained=False))
    path = tmp_path / "resnet18.safetensors"
    save_file({k: v.contiguous() for k, v in source.net.state_dict().items()}, str(path))
    loaded = build_encoder(EncoderConfig("timm:resnet18", weights=str(path)))
    x = torch.rand(1, 3, 64, 64)
    assert torch.equal(source.eval()(x), loaded.eval()(x))

    torch.save(source.net.state_dict(), tmp_path / "plain.pt")  # a weights-only state dict loads too
    build_encoder(EncoderConfig("timm:resnet18", weights=str(tmp_path / "plain.pt")))

    class Payload:  # a pickle that would run code on loading
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({"conv1.weight": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError) as err:
        build_encoder(EncoderConfig("timm:resnet18", weights=str(tmp_path / "evil.pt")))
    assert "refused to load" in one_line(err)


def test_offline_without_weights_says_how_to_pass_a_file(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError) as err:
        build_encoder(EncoderConfig("timm:resnet18"))
    assert "--model.encoder.weights PATH" in one_line(err)


@pytest.fixture(scope="module", params=BACKBONES, ids=[b[0] for b in BACKBONES])
def trained(request, tiny_shapes, tmp_path_factory):
    """(backbone, image size, checkpoint) after two training steps with the top block fine-tuned."""
    from captioning.training.cli import run_lightning_cli

    name, size, _ = request.param
    root = tmp_path_factory.mktemp("fit_" + name.replace(":", "_").replace("/", "_"))
    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            root,
            extra=[
                "--model.encoder.name",
                name,
                "--model.encoder.pretrained",
                "false",
                "--model.encoder.fine_tune_blocks",
                "1",
                "--model.optimizer.encoder_lr",
                "1e-4",
                "--data.image_size",
                str(size),
                "--data.batch_size",
                "4",
            ],
        )
    )
    assert cli.trainer.global_step == 2
    return name, size, Path(cli.trainer.checkpoint_callback.last_model_path)


def test_evaluate_export_and_caption(trained, tiny_shapes, tmp_path):
    name, size, checkpoint = trained
    metrics, results = tmp_path / "metrics.json", tmp_path / "results.json"
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                str(checkpoint),
                "--annotations",
                str(tiny_shapes),
                "--split",
                "test",
                "--num-beams",
                "1",
                "--max-new-tokens",
                "6",
                "--out",
                str(metrics),
                "--results",
                str(results),
            ]
        )
        == 0
    )
    assert len(json.loads(results.read_text())) == 8 and "CIDEr" in json.loads(metrics.read_text())["scores"]
    folder = tmp_path / "folder"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["preprocessing"]["image_size"] == size
    encoder = build_encoder(EncoderConfig(name, pretrained=False))
    assert config["preprocessing"]["mean"] == pytest.approx(encoder.preprocessing["mean"])
    picture = next((tiny_shapes.parent / "images" / "test").glob("*.png"))
    assert main(["caption", str(picture), "--checkpoint", str(folder), "--json", "--max-new-tokens", "6"]) == 0


def test_extract_features(trained, tiny_shapes, tmp_path, capsys):
    name, size, _ = trained
    cfg = yaml.safe_load((ROOT / "configs" / "shapes_soft.yaml").read_text())
    cfg["model"]["encoder"] = {"name": name, "pretrained": False}
    cfg["data"].update(annotations=str(tiny_shapes), image_size=size, num_workers=0)
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "feats"
    assert (
        main(
            ["extract-features", "--config", str(config), "--out", str(out), "--batch-size", "8", "--num-workers", "0"]
        )
        == 0
    )
    assert "56 of 56 images done" in capsys.readouterr().out
    assert json.loads((out / "part-000-of-001.index.json").read_text())["meta"]["encoder"] == name


def test_onnx_export_of_a_vit(trained, tiny_shapes, tmp_path):
    name, _, checkpoint = trained
    if name != "timm:vit_tiny_patch16_224":
        pytest.skip("one backbone is enough")
    pytest.importorskip("onnxruntime", reason="the onnx extra")
    out = tmp_path / "onnx"
    assert main(["export", "--format", "onnx", "--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    from captioning.api import Captioner
    from captioning.export.onnx_captioner import OnnxCaptioner

    images = sorted(str(p) for p in (tiny_shapes.parent / "images" / "test").glob("*.png"))
    ours, theirs = Captioner.from_checkpoint(checkpoint, "cpu")(images), OnnxCaptioner(out)(images)
    assert [r["generated_text"] for r in ours] == [r["generated_text"] for r in theirs]


@pytest.mark.parametrize("config,grid", [("coco_clip_vitb16.yaml", (196, 768)), ("coco_convnext.yaml", (49, 1024))])
def test_coco_configs_name_their_backbones(config, grid, tiny_shapes, capsys):
    from captioning.training.cli import run_lightning_cli

    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(
            [
                "fit",
                "--config",
                str(ROOT / "configs" / config),
                "--data.annotations",
                str(tiny_shapes),
                "--print_config",
            ]
        )
    assert exit_info.value.code == 0
    encoder = yaml.safe_load(capsys.readouterr().out)["model"]["encoder"]
    built = build_encoder(EncoderConfig(**dict(encoder, pretrained=False))).eval()
    with torch.no_grad():
        assert built(torch.rand(1, 3, 224, 224)).shape[1:] == grid


def test_open_clip_weights_from_a_whole_clip_state_dict(tmp_path):
    import open_clip

    clip = open_clip.create_model("ViT-B-32", pretrained=None)
    torch.save(clip.state_dict(), tmp_path / "clip.pt")  # keys "visual.*" beside the text tower's
    encoder = build_encoder(EncoderConfig("open_clip:ViT-B-32", weights=str(tmp_path / "clip.pt"))).eval()
    assert torch.equal(encoder.visual.conv1.weight, clip.visual.conv1.weight)
    images = torch.rand(1, 3, 224, 224)
    with torch.no_grad():
        expected = clip.eval().visual.forward_intermediates(
            (images - encoder.mean) / encoder.std, indices=1, normalize_intermediates=True, intermediates_only=True
        )
        grid = expected["image_intermediates"][-1].flatten(2).transpose(1, 2)  # (1, 768, 7, 7) -> (1, 49, 768)
        assert torch.allclose(encoder(images), grid, atol=1e-5)
