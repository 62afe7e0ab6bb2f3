"""The resize's interpolation: the model's own (bicubic for a timm ViT), recorded in its checkpoint and
model folder and used by every image route; bilinear for models that record none."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from captioning.cli import main
from captioning.data.images import INTERPOLATIONS, load_image, to_array, to_pixels, to_tensor
from captioning.errors import ConfigError
from tests.helpers import ROOT, fit_args

SIZE = 48  # the shapes images are 64 px: resized, so the filter shows


def picture(tiny_shapes) -> Path:
    return sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0]


def test_filters_by_name_and_bilinear_by_default(tiny_shapes):
    image = load_image(picture(tiny_shapes)).resize((97, 83))
    bilinear = to_pixels(image, 40)
    assert np.array_equal(bilinear, to_pixels(image, 40, "bilinear"))
    assert np.array_equal(bilinear, np.asarray(image.resize((40, 40), Image.Resampling.BILINEAR)).transpose(2, 0, 1))
    for name in INTERPOLATIONS:
        assert to_pixels(image, 40, name).shape == (3, 40, 40)
    assert not np.array_equal(to_pixels(image, 40, "bicubic"), bilinear)
    with pytest.raises(ConfigError) as err:
        to_pixels(image, 40, "cubic")
    assert "\n" not in str(err.value) and "unknown interpolation 'cubic'" in str(err.value)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("timm:vit_tiny_patch16_224", "bicubic"),
        ("timm:resnet18", "bicubic"),
        ("open_clip:ViT-B-32", "bicubic"),
        ("small_cnn", "bilinear"),
    ],
)
def test_a_spec_knows_the_encoders_interpolation_without_building_it(name, expected):
    from captioning.models.encoders import EncoderConfig, build_encoder
    from captioning.models.spec import ModelSpec

    if name != "small_cnn":
        pytest.importorskip(name.split(":")[0], reason="the ecosystem extra: pip install -e '.[ecosystem]'")
    config = EncoderConfig(name, pretrained=False)
    spec = ModelSpec(config, image_size=SIZE)
    assert spec.interpolation == expected == build_encoder(config).preprocessing["interpolation"]
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    assert (
        ModelSpec.from_dict({k: v for k, v in spec.to_dict().items() if k != "interpolation"}).interpolation
        == "bilinear"
    )


@pytest.fixture(scope="module")
def vit(tiny_shapes, tmp_path_factory):
    """(CLI, checkpoint) of two training steps of a timm ViT (random weights), whose weights expect bicubic."""
    pytest.importorskip("timm", reason="the ecosystem extra: pip install -e '.[ecosystem]'")
    from captioning.training.cli import run_lightning_cli

    root = tmp_path_factory.mktemp("fit_vit")
    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            root,
            extra=[
                "--model.encoder.name",
                "timm:vit_tiny_patch16_224",
                "--model.encoder.pretrained",
                "false",
                "--data.image_size",
                str(SIZE),
                "--data.batch_size",
                "4",
            ],
        )
    )
    return cli, Path(cli.trainer.checkpoint_callback.last_model_path)


def test_training_data_and_checkpoint_take_the_encoders_interpolation(vit):
    from captioning.storage.load import read_model_file

    cli, checkpoint = vit
    assert cli.datamodule.interpolation == "bicubic"  # linked from model.encoder
    assert cli.model.model.spec.interpolation == "bicubic"
    assert torch.load(checkpoint, weights_only=True)["preprocessing"] == {"interpolation": "bicubic"}
    assert read_model_file(str(checkpoint)).spec.interpolation == "bicubic"


def test_api_folder_and_onnx_resize_with_bicubic(vit, tiny_shapes, tmp_path):
    from captioning.api import Captioner

    _, checkpoint = vit
    image = load_image(picture(tiny_shapes))
    bicubic, bilinear = to_tensor(image, SIZE, "bicubic"), to_tensor(image, SIZE, "bilinear")
    assert not torch.equal(bicubic, bilinear)
    captioner = Captioner.from_checkpoint(checkpoint, "cpu")
    assert captioner.interpolation == "bicubic"
    assert torch.equal(captioner._batch([image])[0], bicubic)

    folder = tmp_path / "folder"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["preprocessing"]["interpolation"] == "bicubic"
    assert "bicubic resize" in (folder / "README.md").read_text()
    assert Captioner.from_pretrained(folder, device="cpu").interpolation == "bicubic"

    pytest.importorskip("onnxruntime", reason="the onnx extra")
    from captioning.export.onnx_captioner import OnnxCaptioner

    onnx = tmp_path / "onnx"
    assert main(["export", "--format", "onnx", "--checkpoint", str(checkpoint), "--out", str(onnx)]) == 0
    onnx_captioner = OnnxCaptioner(onnx)
    assert onnx_captioner.interpolation == "bicubic"
    assert np.array_equal(onnx_captioner.preprocess(image), to_array(image, SIZE, "bicubic"))


def test_evaluate_and_the_web_service_resize_with_the_models_interpolation(vit, tiny_shapes, tmp_path, monkeypatch):
    import captioning.data.captions as captions
    from captioning.web.images import prepare

    _, checkpoint = vit
    seen = []

    class Data(captions.CaptionData):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.interpolation)

    monkeypatch.setattr(captions, "CaptionData", Data)  # (captioning evaluate imports it when it runs)
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
                "4",
                "--out",
                str(tmp_path / "m.json"),
            ]
        )
        == 0
    )
    assert seen == ["bicubic"]
    model_input, _, _ = prepare(str(picture(tiny_shapes)), [(SIZE, "bicubic")])
    assert np.array_equal(
        np.asarray(model_input).transpose(2, 0, 1), to_pixels(load_image(picture(tiny_shapes)), SIZE, "bicubic")
    )


def test_files_that_record_no_interpolation_are_bilinear(vit, tiny_checkpoint, tmp_path):
    from captioning.api import Captioner
    from captioning.storage.load import read_model_file

    _, checkpoint = vit
    old = torch.load(checkpoint, weights_only=True)
    del old["preprocessing"]  # as written before the interpolation was recorded
    torch.save(old, tmp_path / "old.ckpt")
    assert read_model_file(str(tmp_path / "old.ckpt")).spec.interpolation == "bilinear"
    assert Captioner.from_checkpoint(tmp_path / "old.ckpt", "cpu").interpolation == "bilinear"
    folder = tmp_path / "folder"
    assert main(["export", "--checkpoint", str(tmp_path / "old.ckpt"), "--out", str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["preprocessing"]["interpolation"] == "bilinear"
    del config["preprocessing"]["interpolation"]
    (folder / "config.json").write_text(json.dumps(config))
    assert read_model_file(str(folder)).spec.interpolation == "bilinear"
    assert Captioner.from_checkpoint(tiny_checkpoint, "cpu").interpolation == "bilinear"  # a small CNN's


def test_extract_features_from_shards_feeds_training(tiny_shapes, tmp_path, capsys):
    pytest.importorskip("timm", reason="the ecosystem extra: pip install -e '.[ecosystem]'")
    pytest.importorskip("webdataset", reason="the ecosystem extra: pip install -e '.[ecosystem]'")
    from captioning.training.cli import run_lightning_cli

    shards = tmp_path / "shards"
    assert (
        main(
            [
                "prepare",
                "--annotations",
                str(tiny_shapes),
                "--min-word-freq",
                "1",
                "--to-webdataset",
                str(shards),
                "--shard-size",
                "16",
            ]
        )
        == 0
    )
    cfg = yaml.safe_load((ROOT / "configs" / "shapes_soft.yaml").read_text())
    cfg["model"]["encoder"] = {"name": "timm:resnet18", "pretrained": False}
    cfg["data"].update(annotations=str(shards), image_size=32, num_workers=0)
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "feats"
    assert (
        main(
            ["extract-features", "--config", str(config), "--out", str(out), "--batch-size", "16", "--num-workers", "0"]
        )
        == 0
    )
    assert "56 of 56 images done" in capsys.readouterr().out
    assert json.loads((out / "part-000-of-001.index.json").read_text())["meta"]["interpolation"] == "bicubic"
    cli = run_lightning_cli(
        fit_args(
            shards,
            tmp_path / "run",
            extra=[
                "--model.encoder.name",
                "timm:resnet18",
                "--model.encoder.pretrained",
                "false",
                "--data.image_size",
                "32",
                "--data.features",
                str(out),
            ],
        )
    )
    assert cli.trainer.global_step == 2
