"""`captioning attend --layer`: a transformer's cross-attention maps of a chosen layer or their mean
over the layers; a layer the model does not have, or --layer on an LSTM, in one line."""

import pytest
import torch

from captioning.api import Captioner
from captioning.cli import main
from captioning.errors import ConfigError
from captioning.models.transformer import choose_attention_layer
from captioning.storage.folder import save_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_layered_model):
    root = tmp_path_factory.mktemp("attend_layer")
    return {kind: save_folder(root / kind, tiny_layered_model(kind)) for kind in ("transformer", "lstm")}


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("attend_layer_in") / "img.png"
    Image.fromarray((torch.rand(32, 32, 3) * 255).byte().numpy()).save(path)
    return path


def attend(folder, image, out, *extra):
    return main(["attend", str(image), "--checkpoint", str(folder), "--device", "cpu", "--out", str(out), *extra])


def test_each_layer_gives_its_own_maps(tiny_layered_model):
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    maps = []
    for layer in (0, 1, -1):
        m = choose_attention_layer(tiny_layered_model(), layer)
        assert m.decoder.attention_layer == layer % 2 and m.spec.decoder.attention_layer == layer % 2
        maps.append(m.generate(images, config=m.spec.generation).alphas)
    assert not torch.allclose(maps[0], maps[1]) and torch.equal(maps[1], maps[2])
    assert torch.allclose(maps[0].sum(-1), torch.ones_like(maps[0].sum(-1)))  # each word's map sums to 1


def test_the_mean_over_layers_is_the_layers_maps_averaged(tiny_layered_model):
    """--layer mean: the teacher-forced pass's and decoding's maps are the mean of each layer's."""
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    decoded, forced = [], []
    for layer in (0, 1, "mean"):
        m = choose_attention_layer(tiny_layered_model(), layer)
        assert m.decoder.attention_layer == layer and m.spec.decoder.attention_layer == layer
        out = m.generate(images, config=m.spec.generation)
        decoded.append(out.alphas)
        captions = torch.cat([torch.full((2, 1), m.vocab.bos_id), out.sequences], 1)
        lengths = torch.full((2,), captions.size(1))
        with torch.no_grad():
            forced.append(m.decoder(m.encoder(images), captions, lengths).alphas)
    for maps in (decoded, forced):
        assert not torch.allclose(maps[0], maps[1])
        assert torch.allclose(maps[2], (maps[0] + maps[1]) / 2, atol=1e-6)


def test_a_folder_keeps_the_mean_over_layers(tmp_path, tiny_layered_model):
    from captioning.storage.load import load_model

    folder = save_folder(tmp_path / "mean", choose_attention_layer(tiny_layered_model(), "mean"))
    loaded = load_model(folder)
    assert loaded.decoder.attention_layer == "mean" and loaded.spec.decoder.attention_layer == "mean"


def test_attend_draws_the_chosen_layer(folders, image, tmp_path, capsys):
    assert attend(folders["transformer"], image, tmp_path / "a.gif", "--layer", "0") == 0
    assert (tmp_path / "a.gif").stat().st_size > 0
    assert attend(folders["transformer"], image, tmp_path / "m.gif", "--layer", "mean") == 0
    assert (tmp_path / "m.gif").stat().st_size > 0


@pytest.mark.parametrize(
    "kind, layer, words",
    [
        ("transformer", "2", "--layer: expected a layer in 0..1 (the model has 2 layers) or 'mean', got 2"),
        ("transformer", "-3", "--layer: expected a layer in 0..1"),
        ("lstm", "0", "--layer: chooses a transformer decoder's layer; this model's decoder is kind 'lstm'"),
    ],
)
def test_a_layer_the_model_lacks_is_one_line(folders, image, tmp_path, capsys, kind, layer, words):
    assert attend(folders[kind], image, tmp_path / "b.gif", "--layer", layer) != 0
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
    assert not (tmp_path / "b.gif").exists()


def test_a_layer_that_is_not_a_number_or_mean_is_one_line(folders, image, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        attend(folders["transformer"], image, tmp_path / "b.gif", "--layer", "last")
    assert exit.value.code != 0
    err = capsys.readouterr().err.strip()
    assert "argument --layer: expected a layer's number or 'mean', got 'last'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "b.gif").exists()


def test_evaluate_scores_the_chosen_layers_maps(folders, tiny_shapes, tmp_path, capsys):
    """evaluate --layer: the report says whose maps it scored; on an LSTM, one line and no report."""
    import json

    def evaluate(kind, layer, out):
        args = ["--annotations", str(tiny_shapes), "--grounding", "--num-beams", "1", "--layer", layer]
        checkpoints = [a for k in kind.split("+") for a in ("--checkpoint", str(folders[k]))]
        return main(["evaluate", *checkpoints, *args, "--out", str(out), "--device", "cpu"])

    for layer, recorded in (("mean", "mean"), ("-1", 1)):
        assert evaluate("transformer", layer, tmp_path / "t.json") == 0
        report = json.loads((tmp_path / "t.json").read_text())
        assert report["attention_layer"] == recorded and "grounding" in report["scores"]
    # an ensemble's report names its transformer member's layer
    assert evaluate("lstm+transformer", "mean", tmp_path / "e.json") == 0
    assert json.loads((tmp_path / "e.json").read_text())["attention_layer"] == "mean"
    capsys.readouterr()
    assert evaluate("lstm", "0", tmp_path / "l.json") != 0
    err = capsys.readouterr().err.strip()
    assert "--layer: chooses a transformer decoder's layer" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "l.json").exists()


def test_the_api_gives_the_chosen_layers_maps(tiny_layered_model):
    image = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(2))
    first, last = (
        Captioner(choose_attention_layer(tiny_layered_model(), layer))(
            [image], return_attention=True, max_new_tokens=5
        )[0]
        for layer in (0, 1)
    )
    assert first["generated_text"] == last["generated_text"]  # the words do not depend on the drawn layer
    assert first["attention"].shape == last["attention"].shape and first["head_attention"].shape[1] == 2
    assert abs(first["attention"] - last["attention"]).max() > 1e-4
    with pytest.raises(ConfigError):
        choose_attention_layer(tiny_layered_model("lstm"), 1)


def test_attend_draws_one_head_and_refuses_a_head_the_model_lacks(folders, image, tmp_path, capsys):
    assert attend(folders["transformer"], image, tmp_path / "h.png", "--layer", "1", "--head", "1") == 0
    assert (tmp_path / "h.png").stat().st_size > 0
    capsys.readouterr()
    for kind, head, words in (
        ("transformer", "2", "--head: expected a head in 0..1 (the model has 2 heads), got 2"),
        ("lstm", "0", "--head: this model attends with one head (decoder.heads is 1)"),
    ):
        assert attend(folders[kind], image, tmp_path / "c.gif", "--head", head) != 0
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1
        assert not (tmp_path / "c.gif").exists()
