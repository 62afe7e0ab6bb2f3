"""`captioning serve --layer L|mean`: the page's and the API's maps are a transformer's chosen layer's
(or their mean over the layers), and its description names the layer; an LSTM served beside it is
served as it is; a served set without a transformer, or a layer the model lacks, is one line."""

import numpy as np
import pytest
import torch

pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("multipart", reason="the web extra is not installed: pip install -e '.[web]'")

from captioning.api import Captioner  # noqa: E402
from captioning.cli import main  # noqa: E402
from captioning.errors import ConfigError  # noqa: E402
from captioning.models.transformer import choose_attention_layer  # noqa: E402
from captioning.storage.folder import save_folder  # noqa: E402
from captioning.web.client import caption  # noqa: E402
from captioning.web.server import load_models  # noqa: E402
from tests.helpers import get_json  # noqa: E402

SETTINGS = {"num_beams": 1, "max_new_tokens": 5}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_layered_model):
    root = tmp_path_factory.mktemp("serve_layer")
    return {kind: str(save_folder(root / kind, tiny_layered_model(kind))) for kind in ("transformer", "lstm")}


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("serve_layer_in") / "img.png"
    pixels = torch.rand(32, 32, 3, generator=torch.Generator().manual_seed(3))
    Image.fromarray((pixels * 255).byte().numpy()).save(path)
    return path


def served_maps(server, name, image) -> tuple[dict, np.ndarray]:
    """GET /api/models's description of ``name`` and the maps POST /api/caption returns for ``image``."""
    status, info = get_json(server.url, "/api/models")
    assert status == 200
    [described] = [m["description"] for m in info["models"] if m["name"] == name]
    out = caption(image, url=server.url, model=name, **SETTINGS)
    return described, np.array(out["attention"])


def test_the_page_and_the_api_show_the_chosen_layers_maps(folders, image, serve_models, tiny_layered_model):
    maps = {}
    for layer in (None, 1, "mean"):
        models = load_models([f"t={folders['transformer']}", f"lstm={folders['lstm']}"], layer=layer)
        described, maps[layer] = served_maps(serve_models(models), "t", image)
        assert described["attention_layer"] == (0 if layer is None else layer)
        assert "attention_layer" not in [m for m in models if m.name == "lstm"][0].description
        chosen = choose_attention_layer(tiny_layered_model(), 0 if layer is None else layer)
        [want] = Captioner(chosen)([str(image)], return_attention=True, **SETTINGS)
        np.testing.assert_allclose(maps[layer], want["attention"], atol=1e-4)
    # the layer reached the maps: each choice gives its own
    assert abs(maps[None] - maps[1]).max() > 1e-4 and abs(maps[1] - maps["mean"]).max() > 1e-4


@pytest.mark.parametrize(
    "kind, layer, words",
    [
        ("lstm", "0", "--layer: chooses a transformer decoder's layer; this model's decoder is kind 'lstm'"),
        ("transformer", "2", "--layer: expected a layer in 0..1 (the model has 2 layers) or 'mean', got 2"),
    ],
)
def test_a_layer_no_served_model_has_is_one_line(folders, kind, layer, words, capsys):
    with pytest.raises(ConfigError, match="--layer: "):
        load_models([folders[kind]], layer=int(layer))
    assert main(["serve", "--checkpoint", folders[kind], "--layer", layer, "--port", "1"]) != 0
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_a_layer_that_is_not_a_number_or_mean_is_refused_by_the_parser(folders, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--checkpoint", folders["transformer"], "--layer", "last"])
    assert exit_.value.code != 0
    assert "--layer: expected a layer's number or 'mean', got 'last'" in capsys.readouterr().err
