"""One model description (ModelSpec), one loader (load_model), and no training code on the way to a caption."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captioning.decoding.generation import GenerationConfig, bad_ending_ids
from captioning.errors import CheckpointError, ConfigError
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.models.spec import ModelSpec, build_model
from captioning.vocab import Vocabulary

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "v0_1_8e72f85"

CAPTION_WITHOUT_TRAINING_CODE = f"""
import json, sys
from captioning.api import Captioner
image = {str(FIXTURES / "images" / "0.png")!r}
texts = [Captioner.from_checkpoint({str(FIXTURES / "soft.ckpt")!r})(image)[0]["generated_text"],
         Captioner.from_pretrained({str(FIXTURES / "hard_folder")!r})(image)[0]["generated_text"]]
loaded = sorted(m for m in sys.modules if m.startswith(("lightning", "pytorch_lightning", "captioning.training")))
print(json.dumps({{"captions": texts, "training_modules": loaded}}))
"""


def test_captioning_imports_no_lightning_and_no_training_code():
    """A checkpoint and a model folder caption in a process that never imports Lightning or captioning.training."""
    proc = subprocess.run(
        [sys.executable, "-c", CAPTION_WITHOUT_TRAINING_CODE], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert all(isinstance(t, str) and t for t in out["captions"])
    assert out["training_modules"] == []


def small_spec(**decoder) -> ModelSpec:
    return ModelSpec(
        EncoderConfig(channels=(4, 8), dim=8, pretrained=False),
        DecoderConfig(8, 16, 8, dropout=0.0, **decoder),
        image_size=32,
        generation=GenerationConfig(num_beams=2, max_new_tokens=7, attention_temperature=0.5),
    )


def test_spec_round_trips_through_plain_json():
    for spec in (
        ModelSpec(),
        small_spec(),
        small_spec(attention_kind="hard", heads=2, placement="luong", window="local"),
    ):
        plain = json.loads(json.dumps(spec.to_dict()))  # JSON values only
        assert ModelSpec.from_dict(plain) == spec
        assert isinstance(ModelSpec.from_dict(plain).encoder.channels, tuple)
    # a description written before a setting existed takes that setting's default
    plain = small_spec().to_dict()
    del plain["decoder"]["refiner_layers"], plain["generation"]
    assert ModelSpec.from_dict(plain).decoder.refiner_layers == 0
    assert ModelSpec.from_dict(plain).generation == ModelSpec().generation


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: d.update(encoder="x"), "model.encoder: expected a mapping of settings, got str 'x'"),
        (lambda d: d.update(decoder=[1, 2]), "model.decoder: expected a mapping of settings, got list"),
        (lambda d: d["decoder"].update(quantum_attention=True), "model.decoder: unknown setting(s) quantum_attention"),
        (lambda d: d.update(colour="red"), "model: unknown setting(s) colour"),
        (lambda d: d["decoder"].update(hidden_dim="16"), "model.decoder.hidden_dim: expected an integer, got '16'"),
        (lambda d: d["decoder"].update(prev2out=1), "model.decoder.prev2out: expected true or false, got 1"),
        (lambda d: d["decoder"].update(attention_kind="telepathic"), "model.decoder.attention_kind"),
        (lambda d: d["encoder"].update(channels=[4, "wide"]), "model.encoder.channels[1]: expected an integer"),
        (lambda d: d["encoder"].update(name="alexnet"), "model.encoder.name"),
        (lambda d: d.update(image_size=-3), "image_size: expected an integer >= 1"),
        (lambda d: d.update(image_size=None), "model.image_size: expected an integer, got None"),
        (lambda d: d["generation"].update(num_beams=0), "model.generation.num_beams: expected an integer >= 1"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_field(change, words):
    plain = small_spec().to_dict()
    change(plain)
    with pytest.raises(ConfigError) as info:
        ModelSpec.from_dict(plain)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_bad_spec_in_a_folder_is_one_line_naming_config_json(tmp_path):
    from captioning.api import Captioner

    folder = tmp_path / "model"
    Captioner.from_pretrained(FIXTURES / "hard_folder").save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["model"]["decoder"] = "x"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as info:
        Captioner.from_pretrained(folder)
    message = str(info.value)
    assert "\n" not in message and str(folder / "config.json") in message and "model.decoder" in message


def test_build_model_sets_the_bad_ending_ids():
    """forbid_bad_endings works on a model built without the LightningModule."""
    vocab = Vocabulary.build([["a", "dog", "with", "the", "ball"]], min_freq=1)
    model = build_model(small_spec(), vocab).eval()
    assert model.spec == small_spec()
    assert model.decoder.bad_ending_ids == bad_ending_ids(vocab) and len(model.decoder.bad_ending_ids) == 3
    with torch.no_grad():  # "a" likely everywhere, EOS likely right after it
        model.decoder.L_o.bias.zero_()
        model.decoder.L_o.bias[vocab.stoi["a"]] = 4.0
        model.decoder.L_o.bias[vocab.eos_id] = 3.0
    images = torch.rand(16, 3, 32, 32)
    config = GenerationConfig(max_new_tokens=6, do_sample=True)
    plain = model.generate(images=images, config=config, generator=torch.Generator().manual_seed(0)).sequences
    forbidden = model.generate(
        images=images, config=config.replace(forbid_bad_endings=True), generator=torch.Generator().manual_seed(0)
    ).sequences
    ends = lambda rows: [model.vocab.decode(r)[-1:] for r in rows.tolist() if vocab.eos_id in r]  # noqa: E731
    assert any(e == ["a"] for e in ends(plain))
    assert ends(forbidden) and all(e != ["a"] for e in ends(forbidden))


def test_load_model_says_what_it_loaded():
    from captioning.storage.load import load_model

    ckpt = load_model(FIXTURES / "soft.ckpt")
    assert not ckpt.training and ckpt.source.kind == "checkpoint" and ckpt.source.path == str(FIXTURES / "soft.ckpt")
    assert ckpt.spec.image_size == 64 and ckpt.spec.encoder.pretrained is False and ckpt.spec.generation.num_beams == 3
    assert ckpt.card["global_step"] == 30 and ckpt.card["training"]["objective"]["class_path"].endswith("CrossEntropy")
    folder = load_model(FIXTURES / "hard_folder")
    assert folder.source.kind == "folder" and folder.attention_kind == "hard"
    assert folder.card["training_data"] and folder.card["training"]["optimizer"]["lr"] == 0.001
    # a model folder written from it describes the same model
    assert build_model(folder.spec, folder.vocab).spec == folder.spec
