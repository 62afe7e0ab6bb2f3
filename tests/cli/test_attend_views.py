"""The views that teach attention: the API's arrays (``return_views``) and their shapes, the values
they must hold (a Transformer's self-attention equals the teacher-forced pass's, a refiner's maps its
layers' own attention), ``captioning attend --view`` writing each picture, and the one-line errors."""

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.api import VIEW_SHAPES, Captioner
from captioning.cli import main
from captioning.decoding.generation import GenerationConfig
from captioning.errors import ConfigError
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.models.spec import ModelSpec, build_model
from captioning.models.transformer import TransformerConfig
from captioning.storage.folder import save_folder
from captioning.vocab import Vocabulary

WORDS = ["a", "small", "red", "circle", "left", "of", "large", "blue", "square"]
SETTINGS = {"max_new_tokens": 6, "min_new_tokens": 5}
LSTM = dict(embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0)
KINDS = {
    "soft": DecoderConfig(**LSTM),
    "hard": DecoderConfig(**LSTM, attention_kind="hard"),
    "local": DecoderConfig(**LSTM, window="local", local_sigma=1.25),
    "refiner": DecoderConfig(**LSTM, refiner_layers=2, refiner_heads=2),
    "transformer": TransformerConfig(hidden_dim=16, heads=2, layers=2, dropout=0.0, refiner_layers=1, refiner_heads=2),
}


def tiny(kind: str):
    """An untrained model of ``kind`` over a 32-pixel image (an 8 x 8 grid), the same weights each call."""
    torch.manual_seed(0)
    spec = ModelSpec(
        EncoderConfig(channels=(4, 8), dim=8, pretrained=False),
        KINDS[kind],
        image_size=32,
        generation=GenerationConfig(num_beams=1, **SETTINGS),
    )
    return build_model(spec, Vocabulary.build([WORDS], min_freq=1)).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("attend_views")
    return {kind: save_folder(root / kind, tiny(kind)) for kind in KINDS}


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("attend_views_in") / "img.png"
    Image.fromarray((np.random.default_rng(4).random((40, 56, 3)) * 255).astype(np.uint8)).save(path)
    return path


def views_of(kind: str, image, **settings) -> tuple[Captioner, dict]:
    captioner = Captioner.from_model(tiny(kind), device="cpu")
    [result] = captioner(str(image), return_attention=True, return_views=True, **{**SETTINGS, **settings})
    return captioner, result


# ---------------------------------------------------------------------- the API's arrays
@pytest.mark.parametrize(
    "kind, names",
    [
        ("soft", ["alignment", "gate"]),
        ("hard", ["alignment", "gate", "sample"]),
        ("local", ["alignment", "gate", "window"]),
        ("refiner", ["alignment", "gate", "refiner"]),
        ("transformer", ["alignment", "self", "refiner"]),
    ],
)
@pytest.mark.parametrize("beams", [1, 3])
def test_each_view_has_the_shape_the_docs_say(kind, names, beams, image):
    settings = {"num_beams": beams, **({"attention_mode": "sample"} if kind == "hard" else {})}
    captioner, result = views_of(kind, image, **settings)
    assert list(captioner.views()) == names
    views = result["views"]
    assert sorted(views) == sorted(names) and set(views) <= set(VIEW_SHAPES)
    T, L = len(result["tokens"]), 64
    assert T >= 5
    np.testing.assert_array_equal(views["alignment"], result["attention"].reshape(T, L))
    if "gate" in views:  # beta_t = sigmoid(f_beta h): in (0, 1)
        assert views["gate"].shape == (T,) and ((views["gate"] > 0) & (views["gate"] < 1)).all()
    if "window" in views:  # the centre inside the grid, the extent the window's sigma
        assert views["window"].shape == (T, 3)
        assert ((views["window"][:, :2] >= 0) & (views["window"][:, :2] <= 7)).all()
        np.testing.assert_allclose(views["window"][:, 2], 1.25)
    if "sample" in views:  # the sampled cells are the result's cells, inside the grid
        assert views["sample"].shape == (T, 2)
        assert views["sample"].tolist() == [list(c) for c in result["locations"]]
        assert ((views["sample"] >= 0) & (views["sample"] < 8)).all()
    if "refiner" in views:
        layers = 2 if kind == "refiner" else 1
        assert views["refiner"].shape == (layers, 2, L, L)
        np.testing.assert_allclose(views["refiner"].sum(-1), 1.0, rtol=64 * np.finfo(np.float32).eps)
    if "self" in views:  # row t reads positions 0..t: sums to 1 there, 0 beyond
        self_ = views["self"]
        assert self_.shape == (T, 2, 2, T)
        np.testing.assert_allclose(self_.sum(-1), 1.0, rtol=64 * np.finfo(np.float32).eps)
        after = np.triu(np.ones((T, T), bool), 1)
        assert (self_.transpose(0, 3, 1, 2)[after] == 0).all()
        assert np.allclose(self_[0, :, :, 0], 1.0)


def test_the_transformers_self_view_is_its_teacher_forced_self_attention(image):
    """Step t's weights (from the key/value cache, one position at a time) equal row t of the masked
    self-attention of the whole caption run at once."""
    captioner, result = views_of("transformer", image)
    decoder = captioner.model.decoder
    ids = [captioner.vocab.stoi[w] for w in result["tokens"]]
    tokens = torch.tensor([[captioner.vocab.bos_id] + ids[:-1]])
    T = tokens.size(1)
    with torch.no_grad():
        features = captioner.model.encoder(captioner._batch([Image.open(image).convert("RGB")]))  # its own resize
        memory = decoder.memory(features)
        x = decoder.embed(tokens, torch.arange(T))
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        forced = []
        for i, layer in enumerate(decoder.layers):
            kv = layer.self_attention.keys_values(layer.norm_self(x))
            x, _, weights = layer(x, kv, causal, memory[:, i])
            forced.append(weights[0])  # (heads, T, T)
    forced = torch.stack(forced).permute(2, 0, 1, 3).numpy()  # (T, layers, heads, T)
    tolerance = 64 * np.finfo(np.float32).eps  # weights of at most 1, summed in another order: float32 rounding
    np.testing.assert_allclose(result["views"]["self"], forced, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("aoa", [False, True])
def test_the_refiners_maps_are_its_layers_attention(aoa):
    """GridRefiner.maps: layer 0's weights from its own projections, softmax(q k^T / sqrt(d_h)) per head;
    walking the layers to keep the weights leaves the refined features as forward() gives them."""
    from captioning.models.attention.refiner import GridRefiner, grid_position_embedding

    torch.manual_seed(1)
    refiner = GridRefiner(8, 2, 2, 0.0, aoa).double().eval()
    features = torch.randn(3, 16, 8, dtype=torch.float64)
    with torch.no_grad():
        maps = refiner.maps(features)
        x = features + grid_position_embedding(4, 4, 8, dtype=torch.float64)
        if aoa:
            layer = refiner.layers[0]
            y = layer.norm_attention(x)
            q = layer.attention.query(y)
            k = layer.attention.key_value(y)[..., :8]
        else:
            layer = refiner.layers.layers[0]
            y = layer.norm1(x)
            q, k, _ = torch.nn.functional.linear(y, layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias).chunk(
                3, -1
            )
        q, k = (t.view(3, 16, 2, 4).transpose(1, 2) for t in (q, k))
        expected = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1)  # sqrt(d_h) = sqrt(4)
    assert maps.shape == (3, 2, 2, 16, 16)
    torch.testing.assert_close(maps[:, 0], expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(maps[:, 0], maps[:, 1])  # the second layer's own weights


def test_views_need_asking_and_a_view_a_model_lacks_is_one_line(image):
    captioner = Captioner.from_model(tiny("soft"), device="cpu")
    [plain] = captioner(str(image), return_attention=True, **SETTINGS)
    assert "views" not in plain
    with pytest.raises(ConfigError) as err:
        captioner.render(str(image), None, view="window")
    assert str(err.value) == (
        "view window: this model has no window (model.decoder.window local, local_p or local_m); "
        "its views: maps, alignment, gate"
    )
    with pytest.raises(ConfigError, match="this result has no views; caption with return_views=True"):
        captioner.render(str(image), plain, view="gate")


def test_render_gives_gif_bytes_frames_or_a_grid(image, tmp_path):
    """format="gif" without a path: the GIF's bytes (a notebook's IPython.display.Image); no format: the
    frames, as before; a .png path without a format: a grid PNG."""
    captioner, result = views_of("soft", image)
    frames = captioner.render(str(image), result)
    words = [t for t in result["tokens"] if t != captioner.vocab.EOS]
    assert isinstance(frames, list) and len(frames) == len(words) + 1  # a frame per word + the whole caption
    data = captioner.render(str(image), result, format="gif", duration_ms=250)
    assert isinstance(data, bytes) and data[:6] == b"GIF89a"
    path = tmp_path / "g.gif"
    path.write_bytes(data)
    with Image.open(path) as gif:
        assert gif.n_frames == len(frames) and gif.info["duration"] == 250 and gif.size == frames[0].size
    png = captioner.render(str(image), result, tmp_path / "grid.png")
    with Image.open(png) as picture:
        assert picture.format == "PNG" and picture.size == captioner.render(str(image), result, format="png").size


def test_render_draws_each_view_of_a_model(image, tmp_path):
    """Each view's picture: the per-word views decorate the frames (wider than the maps' for the gate's
    bar and the sample's second picture), the matrices are one PNG."""
    for kind, view in (
        ("soft", "gate"),
        ("local", "window"),
        ("hard", "sample"),
        ("soft", "alignment"),
        ("transformer", "self"),
    ):
        captioner, result = views_of(kind, image, **({"attention_mode": "sample"} if kind == "hard" else {}))
        maps = captioner.render(str(image), result)
        if view in ("alignment", "self"):
            picture = captioner.render(str(image), result, view=view)
            assert isinstance(picture, Image.Image) and picture.width > 300
            with pytest.raises(ConfigError, match="a matrix, drawn as a PNG"):
                captioner.render(str(image), result, format="gif", view=view)
            continue
        frames = captioner.render(str(image), result, view=view)
        assert len(frames) == len(maps)
        if view == "window":
            assert frames[0].size == maps[0].size and frames[0].tobytes() != maps[0].tobytes()  # the box drawn over
        else:
            assert frames[0].width > maps[0].width
        assert captioner.render(str(image), result, tmp_path / f"{view}.gif", view=view).stat().st_size > 0


# ---------------------------------------------------------------------- the command
def attend(folder, image, out, *extra):
    return main(["attend", str(image), "--checkpoint", str(folder), "--device", "cpu", "--out", str(out), *extra])


@pytest.mark.parametrize(
    "kind, view, suffix",
    [
        ("soft", "alignment", "png"),
        ("soft", "gate", "gif"),
        ("hard", "sample", "gif"),
        ("hard", "sample", "png"),
        ("local", "window", "gif"),
        ("transformer", "self", "png"),
        ("transformer", "alignment", "png"),
        ("refiner", "self", "png"),
    ],
)
def test_attend_view_writes_its_picture(folders, image, tmp_path, capsys, kind, view, suffix):
    out = tmp_path / f"{kind}_{view}.{suffix}"
    assert attend(folders[kind], image, out, "--view", view, "--max-new-tokens", "6") == 0
    with Image.open(out) as picture:
        assert picture.format == suffix.upper()
        if suffix == "gif":  # a frame per word, then the whole caption
            words = capsys.readouterr().out.split("\t")[1].split()
            assert picture.n_frames == len(words) + 1


def test_attend_matrix_view_into_a_folder_is_a_png(folders, image, tmp_path):
    assert attend(folders["soft"], image, tmp_path / "out", "--view", "alignment") == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["img.png"]


@pytest.mark.parametrize(
    "kind, extra, words",
    [
        ("soft", ["--view", "window"], "--view window: this model has no window (model.decoder.window local, local_p"),
        ("soft", ["--view", "self"], "--view self: this model has no self-attention (a Transformer decoder's words, "),
        (
            "transformer",
            ["--view", "gate"],
            "--view gate: this model has no gate beta_t (the LSTM decoder's); its views: maps, alignment, self",
        ),
        ("soft", ["--view", "sample"], "--view sample: this model has no sampled locations (hard attention"),
        ("soft", ["--view", "alignment", "--format", "gif"], "--view alignment: a matrix, drawn as a PNG"),
        (
            "hard",
            ["--view", "sample", "--attention-mode", "argmax"],
            "--view sample: draws the cells sampled with --attention-mode sample, not argmax",
        ),
        (
            "soft",
            ["--view", "gate", "--heads", "each"],
            "--heads each: chooses the maps of --view maps, not of --view gate",
        ),
    ],
)
def test_a_view_the_model_lacks_is_one_line(folders, image, tmp_path, capsys, kind, extra, words):
    out = tmp_path / "x.png"
    assert attend(folders[kind], image, out, *extra) != 0
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_an_ensembles_views_are_its_mean_maps_only(folders, image, tmp_path, capsys):
    args = ["attend", str(image), "--checkpoint", str(folders["soft"]), "--checkpoint", str(folders["local"])]
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "e.png"), "--view", "window"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.endswith("its views: maps, alignment") and len(err.splitlines()) == 1
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "e.png"), "--view", "alignment"]) == 0


def test_best_of_k_keeps_the_views_of_the_caption_it_keeps(image):
    """location_samples K > 1 keeps the best of K sampled decodings: its views come with it."""
    captioner, result = views_of("hard", image, attention_mode="sample", location_samples=3)
    assert sorted(result["views"]) == ["alignment", "gate", "sample"]
    assert result["views"]["sample"].tolist() == [list(c) for c in result["locations"]]
