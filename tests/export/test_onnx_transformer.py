"""ONNX export of a transformer decoder: the encoder graph gives each layer's cross-attention keys
and values of the grid, the step graph takes and gives the fixed-length self-attention key/value
cache, and the ONNX captioner's one numpy search carries it as named arrays (reordered with the
beams). Greedy and beam captions, their scores and maps equal PyTorch's; the text is the
tokenizer's (chars: no spaces)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.api import Captioner
from captioning.cli import main
from captioning.decoding.generation import GenerationConfig
from captioning.errors import CheckpointError, ConfigError
from captioning.vocab import Vocabulary
from tests.helpers import float32_tolerance

pytest.importorskip("onnxruntime", reason="the onnx extra: pip install -e '.[onnx]'")

EOS = Vocabulary.eos_id
CHARS = list("红蓝绿圆方三角形和在左右上下")

VARIANTS = {  # (seed, decoder options)
    "plain": (0, dict(heads=2)),
    "learned_tied_aoa_refiner": (
        0,
        dict(heads=4, positions="learned", max_positions=12, tie_embeddings=True, aoa=True, refiner_layers=1),
    ),
    "one_head": (2, dict(heads=1, layers=1)),
    "mean_of_3_layers": (1, dict(heads=2, layers=3, attention_layer="mean")),  # the maps: the layers' mean
}


@pytest.fixture(scope="session")
def built(tiny_model):
    """``built(seed=0, **changes)``: conftest's tiny_model, a transformer of a chars vocabulary over
    32-pixel images, sharpened (the grid weighing more) so that its captions vary with the image."""

    def make(seed: int = 0, **changes):
        model = tiny_model(
            "transformer",
            encoder={"channels": (4, 8)},
            vocab=Vocabulary.build([CHARS], min_freq=1, tokenizer="chars"),
            seed=seed,
            image_size=32,
            generation=GenerationConfig(num_beams=3, max_new_tokens=10),
            scale=3.0,
            **changes,
        ).eval()
        with torch.no_grad():
            model.decoder.memory_proj.weight.mul_(10.0)
            for layer in model.decoder.layers:
                layer.cross_attention.output.weight.mul_(4.0)
        return model

    return make


@pytest.fixture(scope="module")
def images() -> list:
    """12 images of 48 x 40 pixels: a block of one colour on a background of another."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(12):
        pixels = np.zeros((40, 48, 3), np.uint8)
        pixels[:] = rng.integers(0, 256, 3)
        x, y = rng.integers(0, 30), rng.integers(0, 25)
        pixels[y : y + 15, x : x + 18] = rng.integers(0, 256, 3)
        out.append(Image.fromarray(pixels))
    return out


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory, built):
    """(the PyTorch Captioner, the OnnxCaptioner of its export through the command line)."""
    from captioning.export.onnx_captioner import OnnxCaptioner
    from captioning.storage.folder import save_folder

    seed, options = VARIANTS[request.param]
    model = built(seed, **options)
    root = tmp_path_factory.mktemp(request.param)
    folder = save_folder(root / "folder", model)
    assert main(["export", "--format", "onnx", "--checkpoint", str(folder), "--out", str(root / "onnx")]) == 0
    return Captioner.from_model(model, "cpu"), OnnxCaptioner(root / "onnx"), model


#: the float32 operations along a value's path through these tiny models, bounding their rounding
#: (tests/helpers.py: float32_tolerance): the encoder's 3 x 3 convolutions over 8 channels (72 products
#: a value), the projections of 8 to 16, two layers of attention over 16 dimensions and 16 locations and
#: their feed-forward of 64: a few hundred
PATH = 512
#: attention maps are probabilities (at most 1): the rounding of PATH operations on numbers up to 2
MAPS = float32_tolerance(2.0, PATH)


def close(a: float, b: float) -> bool:
    """float32 sums of log-probabilities in another order: within 1e-4, relatively beyond 1."""
    return abs(a - b) <= 1e-4 * max(1.0, abs(b))


def assert_identical(ra: list, rb: list, what) -> None:
    """The same token ids (so the same text), scores within float32's rounding, every beam and map alike."""
    assert len(ra) == len(rb)
    for x, y in zip(ra, rb):
        assert x["tokens"] == y["tokens"] and x["generated_text"] == y["generated_text"], (what, x, y)
        assert close(x["score"], y["score"]), (what, x["score"], y["score"])
        assert x.keys() == y.keys(), what
        if "beams" in x:
            assert [b["generated_text"] for b in x["beams"]] == [b["generated_text"] for b in y["beams"]], what
            assert all(close(p["score"], q["score"]) for p, q in zip(x["beams"], y["beams"])), what
        if "attention" in x:
            assert x["locations"] == y["locations"], what
            np.testing.assert_allclose(x["attention"], y["attention"], **MAPS)
        if "head_attention" in x:
            np.testing.assert_allclose(x["head_attention"], y["head_attention"], **MAPS)


@pytest.mark.parametrize(
    "settings",
    [
        dict(num_beams=1),
        dict(num_beams=3, num_return_sequences=2),
        dict(num_beams=3, length_penalty=0.3, no_repeat_ngram_size=1, forbid_bad_endings=True, max_new_tokens=9),
        dict(num_beams=1, repetition_penalty=1.4, min_new_tokens=3, suppress_tokens=("红",)),
    ],
    ids=str,
)
def test_onnx_captions_as_pytorch(pair, images, settings):
    torch_captioner, onnx_captioner, model = pair
    ra = torch_captioner(images, return_attention=True, **settings)
    rb = onnx_captioner(images, return_attention=True, **settings)
    assert_identical(ra, rb, settings)
    texts = [r["generated_text"] for r in ra]
    assert len(set(texts)) > 2 and all(" " not in t for t in texts)  # varied captions, chars joined without spaces
    for r in rb:  # the text is the tokens joined by the vocabulary's tokenizer
        words = [t for t in r["tokens"] if t not in (Vocabulary.PAD, Vocabulary.BOS, Vocabulary.EOS)]
        assert r["generated_text"] == onnx_captioner.vocab.tokenizer.detokenize(words)
    assert ("head_attention" in rb[0]) == (model.decoder.heads > 1)


def test_the_folder_describes_the_transformers_state(pair):
    from captioning.export.onnx import onnx_unsupported

    _, onnx_captioner, model = pair
    assert onnx_unsupported(model.decoder.config) == ""  # every transformer option is in its own step
    config = json.loads((Path(onnx_captioner.folder) / "config.json").read_text())
    assert config["model"]["decoder"]["kind"] == "transformer"
    state = config["onnx"]["state"]
    dec = model.decoder
    assert state["carried"]["cache"] == {"zeros": [dec.num_layers, 2, "steps", dec.hidden_dim], "dtype": "float32"}
    assert state["constants"] == ["memory"] and config["onnx"]["encoder_outputs"] == ["memory"]
    assert state["max_steps"] == (dec.max_positions if dec.position_embedding is not None else None)
    assert list(config["onnx"]["steps"]) == ["expected"]


def test_the_step_graph_is_the_decoders_step_and_the_cache_follows_the_beams(pair):
    """Three steps of K = 3 beams per image through the ONNX step graph, then each beam continues
    another beam of its image (the search's reordering of the carried arrays): the fourth step's
    log-probabilities are those of the teacher-forced pass over the reordered words."""
    _, onnx_captioner, model = pair
    dec = model.decoder
    B, K = 2, 3
    images = torch.rand(B, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    encoded = onnx_captioner.encode(images.numpy())
    with torch.no_grad():
        features = model.encoder(images)
        memory = dec.memory(features).numpy()
        np.testing.assert_allclose(encoded["memory"], memory, **float32_tolerance(memory, PATH))
    carried, constants = onnx_captioner.start(encoded, 8)
    carried = {k: np.repeat(v, K, 0) for k, v in carried.items()}
    words = torch.randint(4, len(model.vocab), (B * K, 5), generator=torch.Generator().manual_seed(4))
    words[:, 0] = Vocabulary.bos_id
    state = dec.initial_state(features, max_steps=8).expand_beams(K)
    for t in range(3):
        logp, carried, alpha, heads = onnx_captioner.step(words[:, t].numpy(), carried, constants)
        with torch.no_grad():
            ref, state, g = dec.step(words[:, t], state)
        np.testing.assert_allclose(logp, ref.numpy(), **float32_tolerance(ref, PATH))
        np.testing.assert_allclose(carried["cache"], state.cache.numpy(), **float32_tolerance(state.cache, PATH))
        np.testing.assert_allclose(alpha, g.alpha.numpy(), **MAPS)
        assert (heads is None) == (g.head_alpha is None)
    parent = np.array([2, 2, 0, 4, 3, 3])  # each beam takes another beam of its image as its parent
    carried = {k: v[parent] for k, v in carried.items()}
    words = words[torch.from_numpy(parent)]
    logp, _, _, _ = onnx_captioner.step(words[:, 3].numpy(), carried, constants)
    with torch.no_grad():
        forced = dec(features.repeat_interleave(K, 0), words, torch.full((B * K,), 5), static=True).logits[:, 3]
    reference = forced.log_softmax(-1).numpy()
    np.testing.assert_allclose(logp, reference, **float32_tolerance(reference, PATH))
    unordered, _, _, _ = onnx_captioner.step(
        words[:, 3].numpy(), {k: np.repeat(v[::K], K, 0) for k, v in carried.items()}, constants
    )
    assert np.abs(unordered - logp).max() > 1e-3  # the reordering matters: another history, other words


def test_learned_positions_end_where_pytorchs_do(tmp_path, images, built):
    from captioning.export.onnx import export_onnx
    from captioning.export.onnx_captioner import OnnxCaptioner

    model = built(positions="learned", max_positions=6)
    onnx_captioner = OnnxCaptioner(export_onnx(model, tmp_path / "onnx"))
    messages = []
    for captioner in (Captioner.from_model(model, "cpu"), onnx_captioner):
        with pytest.raises(ConfigError) as err:
            captioner(images[:1], max_new_tokens=7)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "learned positions end at 6" in messages[0] and "\n" not in messages[0]
    assert onnx_captioner(images[:2], max_new_tokens=6)


def test_a_damaged_state_description_is_one_line(tmp_path, built):
    import shutil

    from captioning.export.onnx import export_onnx
    from captioning.export.onnx_captioner import OnnxCaptioner

    source = export_onnx(built(), tmp_path / "onnx")
    for field, value, words in (
        ("carried", {"cache": {"zeros": [2, "T"], "dtype": "float32"}}, "onnx.state.carried.cache must name"),
        ("constants", [], "onnx.state.constants must be a non-empty list"),
        ("carried", {"position": "features"}, "has no output features that config.json's onnx.state names"),
        ("max_steps", 0, "onnx.state.max_steps must be a positive integer or null"),
    ):
        folder = tmp_path / f"bad_{field}_{len(str(value))}"
        shutil.copytree(source, folder)
        config = json.loads((folder / "config.json").read_text())
        config["onnx"]["state"][field] = value
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(CheckpointError) as err:
            OnnxCaptioner(folder)
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "zeros, words",
    [
        ([2, 2, "steps", 2**40], "more than the 1,048,576 a state may hold"),  # was a memory-error traceback
        ([2**20, 2**20, 2**20], "about 2^60 values a row"),
        ([2, 2, "steps", 17], "its input cache is of shape"),  # not the step graph's (16)
        ([2, "steps", 16], "its input cache is of shape"),
    ],
)
def test_a_carried_state_the_graph_does_not_take_is_refused_before_it_is_allocated(built, tmp_path, zeros, words):
    import shutil

    from captioning.export.onnx import export_onnx
    from captioning.export.onnx_captioner import OnnxCaptioner

    folder = tmp_path / "onnx"
    shutil.copytree(export_onnx(built(), tmp_path / "source"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["onnx"]["state"]["carried"]["cache"]["zeros"] = zeros
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        OnnxCaptioner(folder)
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
