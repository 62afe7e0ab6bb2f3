"""Steering: a focus prior on the attention (decoding/steering.py) and a forced prefix (GenerationConfig.prefix)."""

import json

import pytest
import torch

from captioning.decoding.generation import GenerationConfig
from captioning.decoding.search import generate
from captioning.decoding.steering import Focused, cell_coverage, check_box, focus_biases, focus_prior
from captioning.errors import ConfigError
from captioning.models.decoder import DecoderStates
from captioning.vocab import Vocabulary

EOS = Vocabulary.eos_id
V, D, L = 12, 10, 16


@pytest.fixture
def decoder_of(make_decoder):
    """conftest's make_decoder at this file's sizes, float32: ``decoder_of(kind="soft", **variant)``."""
    return lambda kind="soft", **variant: make_decoder(
        dtype=torch.float32, vocab_size=V, feature_dim=D, embed_dim=8, hidden_dim=16, attention_kind=kind, **variant
    )


def _features():
    return 3 * torch.randn(3, L, D, generator=torch.Generator().manual_seed(1))


def test_coverage_maps_pixels_to_the_grid():
    # a 100 x 50 image on a 4 x 4 grid: the box covers columns 0-1 fully and rows 0-1 fully
    cov = cell_coverage((0, 0, 50, 25), 100, 50, 4, 4).view(4, 4)
    assert torch.equal(cov[:2, :2], torch.ones(2, 2)) and cov[2:].sum() == 0 and cov[:, 2:].sum() == 0
    # a box across cell borders: shares of cells, summing to its area in cell units
    cov = cell_coverage((10, 10, 40, 30), 80, 80, 4, 4)
    assert float(cov.sum()) == pytest.approx((30 / 20) * (20 / 20))
    assert cov.max() <= 1 and cov.min() >= 0
    prior = focus_prior((0, 0, 40, 40), 80, 80, 4, 4, 5.0).view(4, 4)
    assert prior[:2, :2].abs().max() == 0 and (prior[2:, 2:] == -5.0).all()


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_a_strong_prior_moves_the_attention_into_the_box(kind, decoder_of):
    dec, features = decoder_of(kind), _features()
    bias = torch.full((3, L), -1e4, dtype=torch.float64)
    bias[:, 0] = 0.0  # only the top-left cell
    config = GenerationConfig(max_new_tokens=6, attention_mode="sample" if kind == "hard" else "expected")
    out = generate(Focused(dec, bias), features, config, torch.Generator().manual_seed(0))
    real = out.alphas.sum(-1) > 0
    assert torch.allclose(out.alphas[real][:, 0], torch.ones(int(real.sum())))
    if kind == "hard":  # the sampling distribution is the steered one: every sample is the top-left cell
        assert (out.locations[real] == 0).all()


VARIANTS = {
    "multihead": dict(heads=4),
    "general": dict(score="general"),
    "luong": dict(placement="luong"),
    "local": dict(window="local", local_sigma=1.5),
    "refiner": dict(refiner_layers=1, refiner_heads=2, heads=2),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_attention_variant_is_steered(variant, decoder_of):
    """The prior reaches every head, the local window and the refined grid: all of each map in the box."""
    dec, features = decoder_of(**VARIANTS[variant]), _features()
    bias = torch.full((3, L), -1e4, dtype=torch.float64)
    bias[:, [0, 1, 4, 5]] = 0.0  # the top-left 2 x 2 cells
    for beams in (1, 3):
        out = generate(Focused(dec, bias), features, GenerationConfig(num_beams=beams, max_new_tokens=6))
        real = out.alphas.sum(-1) > 0
        assert out.alphas[real][:, [0, 1, 4, 5]].sum(-1).min() > 1 - 1e-6
        if out.head_alphas is not None:  # each head's map, not only their mean
            heads = out.head_alphas[real]
            assert heads.size(1) == VARIANTS[variant]["heads"] and heads[..., [0, 1, 4, 5]].sum(-1).min() > 1 - 1e-6
        plain = generate(dec, features, GenerationConfig(num_beams=beams, max_new_tokens=6))
        assert (plain.alphas[plain.alphas.sum(-1) > 0][:, [0, 1, 4, 5]].sum(-1) < 0.99).any()  # unsteered: not so


def test_focus_with_a_beam_search_and_no_bias_elsewhere(decoder_of):
    dec, features = decoder_of(), _features()
    zero = torch.zeros(3, L, dtype=torch.float64)
    for beams in (1, 3):
        config = GenerationConfig(num_beams=beams, max_new_tokens=6)
        plain, focused = generate(dec, features, config), generate(Focused(dec, zero), features, config)
        assert torch.equal(plain.sequences, focused.sequences) and torch.equal(plain.scores, focused.scores)


def test_bad_boxes_and_strengths_are_one_line():
    with pytest.raises(ConfigError, match="outside the 64x48 image"):
        check_box((0, 0, 65, 10), 64, 48)
    with pytest.raises(ConfigError, match="zero area"):
        check_box((3, 3, 3, 10), 64, 48)
    with pytest.raises(ConfigError, match="inverted"):
        check_box((10, 3, 3, 10), 64, 48)
    for strength in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="expected a finite number >= 0"):
            focus_biases([(0, 0, 8, 8)], [(64, 64)], L, strength)
    assert focus_biases([(0, 0, 8, 8)], [(64, 64)], L, 0.0) is None  # strength 0: no prior at all


# ------------------------------------------------------------------ through the Captioner and the commands
@pytest.fixture(scope="module")
def captioner(tiny_checkpoint):
    from captioning.api import Captioner

    return Captioner.from_checkpoint(tiny_checkpoint, "cpu")


@pytest.fixture(scope="module")
def one_object_image(tiny_shapes):
    data = json.loads(tiny_shapes.read_text())
    image = next(i for i in data["images"] if len(i["objects"]) == 1)
    return tiny_shapes.parent / image["filepath"] / image["filename"], image


def test_strength_zero_is_bit_identical_to_no_focus(captioner, tiny_shapes):
    from tests.helpers import shapes_test_images

    images = shapes_test_images(tiny_shapes, 4)
    for beams in (1, 3):
        plain = captioner(images, num_beams=beams, return_attention=True)
        zero = captioner(images, num_beams=beams, return_attention=True, focus=(0, 0, 16, 16), focus_strength=0)
        for a, b in zip(plain, zero):
            assert a["generated_text"] == b["generated_text"] and a["score"] == b["score"]
            assert (a["attention"] == b["attention"]).all()


def test_a_strong_focus_on_an_empty_corner_still_ends(captioner, one_object_image):
    path, image = one_object_image
    x0, y0, x1, y1 = image["objects"][0]["bbox"]
    W, H = image["width"], image["height"]
    # the corner farthest from the object
    corner = (0, 0, 8, 8) if x0 + x1 > W and y0 + y1 > H else (W - 8, H - 8, W, H)
    for beams in (1, 3):
        out = captioner([str(path)], num_beams=beams, return_attention=True, focus=corner, focus_strength=1e6)[0]
        assert out["tokens"][-1] == Vocabulary.EOS or len(out["tokens"]) == captioner.generation.max_new_tokens
        assert torch.isfinite(torch.tensor(out["score"])) and not torch.tensor(out["attention"]).isnan().any()
        gh, gw = out["attention"].shape[1:]
        inside = cell_coverage(corner, W, H, gh, gw).view(gh, gw) > 0
        assert out["attention"][:, inside.numpy()].sum(-1).min() > 0.99  # every step looks in the corner


def test_bad_focus_through_the_api_is_one_line(captioner, one_object_image):
    path = str(one_object_image[0])
    with pytest.raises(ConfigError, match=r"focus: the box .* is outside the 64x64 image"):
        captioner([path], focus=(0, 0, 65, 10))
    with pytest.raises(ConfigError, match="focus_strength: expected a finite number >= 0"):
        captioner([path], focus=(0, 0, 10, 10), focus_strength=float("nan"))
    with pytest.raises(ConfigError, match="expected one box or one per image"):
        captioner([path], focus=[(0, 0, 10, 10), (0, 0, 5, 5)])


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--focus", "4,4,4,10"], "--focus: the box 4,4,4,10 has zero area"),
        (["--focus", "9,0,4,10"], "--focus: the box 9,0,4,10 is inverted"),
        (["--focus", "1,2,3"], "--focus: expected four finite numbers"),
        (["--focus", "0,0,9,9", "--focus-strength", "-2"], "--focus-strength: expected a finite number >= 0"),
        (["--focus", "0,0,9,9", "--focus-strength", "inf"], "--focus-strength: expected a finite number >= 0"),
        (["--prefix", "a zebra"], "prefix: 'zebra' is not a word of the model's vocabulary"),
    ],
)
def test_bad_steering_flags_are_one_line(flags, expected, tiny_checkpoint, one_object_image, capsys):
    from captioning.cli.main import main

    try:
        code = main(["caption", str(one_object_image[0]), "--checkpoint", str(tiny_checkpoint), *flags])
    except SystemExit as exit:
        code = exit.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err


def test_a_box_outside_one_image_skips_that_image_and_captions_the_rest(
    tiny_checkpoint, one_object_image, tmp_path, capsys
):
    """A batch command: the image the box does not fit is reported by its file name, the others are
    captioned, and the exit is non-zero (as for an unreadable image)."""
    from PIL import Image

    from captioning.cli.main import main

    path, _ = one_object_image
    small = tmp_path / "small.png"
    Image.open(path).convert("RGB").resize((20, 20)).save(small)
    code = main(
        ["caption", str(path), str(small), "--checkpoint", str(tiny_checkpoint), "--focus", "0,0,40,40", "--json"]
    )
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert code == 1
    assert [r["image"] for r in rows if "error" not in r] == [str(path)] and rows[0]["generated_text"]
    bad = [r for r in rows if "error" in r]
    assert len(bad) == 1 and "outside the 20x20 image of" in bad[0]["error"] and "small.png" in bad[0]["error"]
    assert "1 image skipped" in captured.err


def test_the_focus_flag_captions(tiny_checkpoint, one_object_image, capsys):
    from captioning.cli.main import main

    path, image = one_object_image
    box = ",".join(str(v) for v in image["objects"][0]["bbox"])
    assert main(["caption", str(path), "--checkpoint", str(tiny_checkpoint), "--focus", box, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["image"].endswith(image["filename"]) and rows[0]["generated_text"]


# ------------------------------------------------------------------ ensembles
@pytest.fixture(scope="module")
def member_folders(tmp_path_factory, tiny_model):
    """Model folders of two random small models, soft and hard (sharpened so that their captions vary
    with the image)."""
    from captioning.storage.folder import save_folder

    tmp = tmp_path_factory.mktemp("steer_ensemble")
    words = ["a", "red", "blue", "green", "circle", "square", "triangle", "and", "on", "left", "right"]
    folders = []
    for name, seed, kind, image_size in (("a", 3, "soft", 32), ("b", 4, "hard", 48)):
        model = tiny_model(
            kind,
            encoder={"channels": (4, 8)},
            vocab=words,
            seed=seed,
            image_size=image_size,
            generation=GenerationConfig(num_beams=3, max_new_tokens=10),
            eos=0.5,
            scale=3.0,
        ).eval()
        folders.append(save_folder(tmp / name, model, {}, model.spec))
    return tuple(folders)


def _images():
    return [torch.rand(3, 40, 40, generator=torch.Generator().manual_seed(k)) for k in range(3)]


def test_an_ensemble_of_one_model_is_steered_as_the_model(member_folders):
    from captioning.api import Captioner

    single = Captioner.from_checkpoint(member_folders[0], "cpu")
    ensemble = Captioner.from_checkpoints(member_folders[:1], device="cpu")
    for beams in (1, 3):
        kwargs = dict(num_beams=beams, return_attention=True, focus=(20, 0, 40, 20), focus_strength=5.0)
        for a, b in zip(single(_images(), **kwargs), ensemble(_images(), **kwargs)):
            assert a["generated_text"] == b["generated_text"] and a["score"] == b["score"]
            assert (a["attention"] == b["attention"]).all()
        plain = single(_images(), num_beams=beams, return_attention=True)
        assert any((p["attention"] != f["attention"]).any() for p, f in zip(plain, single(_images(), **kwargs)))


def test_a_model_with_itself_is_steered_as_the_model(member_folders):
    from captioning.api import Captioner

    single = Captioner.from_checkpoint(member_folders[0], "cpu")
    twice = Captioner.from_checkpoints([member_folders[0]] * 2, device="cpu")
    kwargs = dict(num_beams=3, return_attention=True, focus=[(0, 0, 20, 40), None, (10, 10, 30, 30)])
    for a, b in zip(single(_images(), **kwargs), twice(_images(), **kwargs)):
        assert a["generated_text"] == b["generated_text"] and a["score"] == pytest.approx(b["score"], abs=1e-5)
        assert torch.allclose(torch.tensor(a["attention"]), torch.tensor(b["attention"]), atol=1e-5)


def test_every_member_of_an_ensemble_reads_the_box(member_folders):
    """Members of different grids (8 x 8 and 12 x 12) and kinds: each one's maps lie in the box."""
    from captioning.api import Captioner

    ensemble = Captioner.from_checkpoints(member_folders, device="cpu")
    assert ensemble.grid_locations == (64, 144)
    box = (0, 0, 20, 20)  # the top-left quarter of the 40 x 40 images: cells 0-3 of the 8 x 8 grid
    for beams in (1, 3):
        for out in ensemble(_images(), num_beams=beams, return_attention=True, focus=box, focus_strength=1e4):
            maps = torch.tensor(out["member_attention"])  # (T, members, 8, 8): each member's map on the first grid
            assert maps.shape[1:] == (2, 8, 8)
            assert maps[..., :4, :4].sum((-1, -2)).min() > 0.99
            assert torch.isfinite(torch.tensor(out["score"]))
    with pytest.raises(ConfigError, match="outside the 40x40 image"):
        ensemble(_images(), focus=(0, 0, 41, 20))


def test_steer_problem_names_the_decoder_that_cannot_be_steered(decoder_of):
    from captioning.decoding.ensemble import EnsembleDecoder
    from captioning.decoding.steering import steer_problem

    class NoScores:  # a decoder without attention scores to steer
        vocab_size, attention_kind, state_layout = V, "soft", DecoderStates

    assert steer_problem(decoder_of()) is None
    assert steer_problem(EnsembleDecoder([decoder_of(), decoder_of("hard")], (0.5, 0.5))) is None
    assert steer_problem(EnsembleDecoder([decoder_of(), NoScores()], (0.5, 0.5))) == (
        "focus: a NoScores has no attention scores to steer"
    )
    with pytest.raises(ConfigError, match="NoScores has no attention scores"):
        Focused(NoScores(), torch.zeros(1, L))


# ------------------------------------------------------------------ prefix
@pytest.mark.parametrize(
    "options", [dict(), dict(num_beams=3), dict(do_sample=True), dict(num_beams=2, cuda_graphs=True)]
)
def test_every_search_continues_the_prefix(options, decoder_of):
    dec, features = decoder_of(), _features()
    prefix = (5, 7, 4)
    config = GenerationConfig(max_new_tokens=8, prefix=prefix, **options)
    out = generate(dec, features, config, torch.Generator().manual_seed(0))
    assert out.sequences[:, :3].tolist() == [list(prefix)] * 3
    assert torch.isfinite(out.scores).all()
    # the score is the continuation's: the teacher-forced log p of the tokens after the prefix
    for i in range(3):
        n = int(out.lengths[i])
        captions = torch.cat([torch.tensor([Vocabulary.bos_id]), out.sequences[i, :n]])[None]
        with torch.no_grad():
            logits = dec(features[i : i + 1], captions, torch.tensor([n + 1])).step_logits
        logp = torch.log_softmax(logits, -1).gather(1, captions[0, 1:, None])[:, 0]
        assert float(out.scores[i]) * n == pytest.approx(float(logp[3:].sum()), abs=1e-4)


def test_prefix_words_and_bad_prefixes():
    vocab = Vocabulary.build([["a", "large", "red", "circle"]], min_freq=1)
    config = GenerationConfig(prefix="A large").resolve_tokens(vocab)
    assert config.prefix == (vocab.stoi["a"], vocab.stoi["large"])
    with pytest.raises(ConfigError, match="prefix: 'zebra' is not a word"):
        GenerationConfig(prefix=("a", "zebra")).resolve_tokens(vocab)
    with pytest.raises(ConfigError, match="cannot start a caption"):
        GenerationConfig(prefix=("a", Vocabulary.EOS))
    with pytest.raises(ConfigError, match="must be shorter than max_new_tokens"):
        GenerationConfig(prefix=("a", "large"), max_new_tokens=2)
    assert GenerationConfig(prefix="").prefix == ()


def test_attend_with_a_box_outside_one_image_draws_the_rest(tiny_checkpoint, one_object_image, tmp_path, capsys):
    from PIL import Image

    from captioning.cli.main import main

    path, _ = one_object_image
    small = tmp_path / "small.png"
    Image.open(path).convert("RGB").resize((20, 20)).save(small)
    out = tmp_path / "maps"
    code = main(
        [
            "attend",
            str(path),
            str(small),
            "--checkpoint",
            str(tiny_checkpoint),
            "--focus",
            "0,0,40,40",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "outside the 20x20 image of" in err and "1 image skipped" in err
    drawn = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert drawn and all(path.stem in name for name in drawn), drawn
