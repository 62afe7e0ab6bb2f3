"""The Python API: Captioner on paths, PIL images and tensors; attention maps; render()."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.api import Captioner, as_pil
from captioning.cli import main
from captioning.data.images import load_image
from captioning.errors import ConfigError, ImageError
from captioning.viz import pictures as V
from tests.helpers import caption_tokens

SETTINGS = dict(num_beams=2, max_new_tokens=8)


@pytest.fixture(scope="module")
def captioner(tiny_checkpoint):
    return Captioner.from_checkpoint(tiny_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def images(tiny_shapes):
    return sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[:3]


def _tensor(pil):
    return torch.from_numpy(np.array(pil.convert("RGB"))).permute(2, 0, 1).float() / 255  # (3, H, W)


def test_paths_pil_images_and_tensors_give_the_same_captions(captioner, images):
    pils = [Image.open(p) for p in images]
    by_path = captioner([str(p) for p in images], **SETTINGS)
    by_pil = captioner(pils, **SETTINGS)
    by_tensor = captioner([_tensor(im) for im in pils], **SETTINGS)
    texts = [r["generated_text"] for r in by_path]
    assert [r["generated_text"] for r in by_pil] == texts == [r["generated_text"] for r in by_tensor]
    assert [r["score"] for r in by_pil] == pytest.approx([r["score"] for r in by_path])
    # one image in, a list of one out; a pathlib.Path works too; batching does not change answers
    [single] = captioner(images[0], **SETTINGS)
    assert single["generated_text"] == texts[0]
    assert [r["generated_text"] for r in captioner(list(images), batch_size=2, **SETTINGS)] == texts
    for r in by_path:
        assert set(r) == {"generated_text", "score", "tokens"}
        assert isinstance(r["score"], float) and all(isinstance(t, str) for t in r["tokens"])
    with pytest.raises(ImageError, match="path, a PIL image, a numpy array or a tensor"):
        captioner(42)
    with pytest.raises(ImageError, match=r"\(3, H, W\)"):
        captioner(torch.zeros(1, 8, 8))
    with pytest.raises(ImageError, match=r"must lie in \[0, 1\]"):
        captioner(_tensor(pils[0]) * 255)  # an image in [0, 255] is an error, not a white square


def _exif_rotated(path, tmp_path):
    """A JPEG stored sideways with EXIF orientation 6 (display rotated 90 degrees clockwise)."""
    from PIL import Image as PILImage

    with PILImage.open(path) as im:
        sideways = im.convert("RGB").transpose(PILImage.Transpose.ROTATE_90)
    exif = PILImage.Exif()
    exif[0x0112] = 6
    out = tmp_path / "exif6.jpg"
    sideways.save(out, exif=exif, quality=95)
    return out


def _variants(path, tmp_path):
    """RGBA (half-transparent), 16-bit grey and EXIF-rotated versions of a test image, as files."""
    with Image.open(path) as im:
        rgb = im.convert("RGB")
    rgba = rgb.copy()
    rgba.putalpha(Image.new("L", rgb.size, 128))
    rgba.save(tmp_path / "rgba.png")
    grey16 = Image.fromarray(np.asarray(rgb.convert("L"), dtype=np.uint16) * 257)
    grey16.save(tmp_path / "grey16.png")
    return [tmp_path / "rgba.png", tmp_path / "grey16.png", _exif_rotated(path, tmp_path)]


def test_every_route_gives_the_same_caption_and_score(captioner, images, tmp_path):
    """A path, the PIL image opened from it, its pixels as an array and as a tensor: one set of
    rules (alpha over white, 16-bit scaling, EXIF orientation), so one caption and one score."""
    for path in _variants(images[0], tmp_path):
        opened = Image.open(path)
        routes = {"path": str(path), "pil": opened}
        if "exif" not in path.name:  # an array has no EXIF: give the pixels as stored
            pixels = np.asarray(opened)
            routes["array"] = pixels
            if pixels.dtype == np.uint8 and pixels.ndim == 3:
                routes["tensor"] = torch.from_numpy(pixels).permute(2, 0, 1).float() / 255
        results = {name: captioner(image, **SETTINGS)[0] for name, image in routes.items()}
        reference = results["path"]
        for name, r in results.items():
            assert r["generated_text"] == reference["generated_text"], (path.name, name)
            assert r["score"] == pytest.approx(reference["score"], abs=1e-5), (path.name, name)
        assert np.array_equal(np.asarray(as_pil(opened)), np.asarray(load_image(path))), path.name


def test_return_attention_gives_a_map_per_token(captioner, images):
    for r in captioner([str(p) for p in images], return_attention=True, **SETTINGS):
        T = len(r["tokens"])
        assert r["attention"].ndim == 3 and r["attention"].shape[0] == T
        gh, gw = r["attention"].shape[1:]
        assert np.allclose(r["attention"].reshape(T, -1).sum(axis=1), 1.0, atol=1e-4)
        assert len(r["locations"]) == T and all(0 <= a < gh and 0 <= b < gw for a, b in r["locations"])
        # a soft model's location is its map's maximum
        assert all(r["attention"][t, a, b] == r["attention"][t].max() for t, (a, b) in enumerate(r["locations"]))
        words = r["tokens"][:-1] if r["tokens"][-1] == captioner.vocab.EOS else r["tokens"]
        assert words == caption_tokens(r["generated_text"])


def test_api_and_cli_give_identical_captions(captioner, images, tiny_checkpoint, capsys):
    api = captioner([str(p) for p in images], **SETTINGS)
    assert (
        main(
            [
                "caption",
                *map(str, images),
                "--checkpoint",
                str(tiny_checkpoint),
                "--json",
                "--device",
                "cpu",
                "--num-beams",
                str(SETTINGS["num_beams"]),
                "--max-new-tokens",
                str(SETTINGS["max_new_tokens"]),
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["generated_text"] for r in rows] == [r["generated_text"] for r in api]
    assert [r["score"] for r in rows] == pytest.approx([r["score"] for r in api])


def test_render_returns_frames_or_a_grid_and_writes_files(captioner, images, tmp_path):
    image = Image.open(images[0])
    [result] = captioner(image, return_attention=True, **SETTINGS)
    n_words = len(caption_tokens(result["generated_text"]))
    frames = captioner.render(image, result)
    assert len(frames) == n_words + 1 and len({f.size for f in frames}) == 1
    grid = captioner.render(image, result, format="png")
    assert isinstance(grid, Image.Image)
    gif = captioner.render(image, result, tmp_path / "a.gif", duration_ms=300)
    png = captioner.render(images[0], None, tmp_path / "a.png", format="png", **SETTINGS)  # captions it first
    assert gif.is_file() and png.is_file()
    with Image.open(gif) as g:
        assert g.n_frames == n_words + 1 and g.info["duration"] == 300
    with Image.open(png) as p:
        assert p.size == grid.size
    with pytest.raises(ValueError, match="format"):
        captioner.render(image, result, format="jpg")


def _bright(picture: Image.Image) -> tuple[int, int]:
    """(y, x) centre of mass of the brightest pixels (the hot end of the colour map)."""
    a = np.asarray(picture.convert("RGB"), dtype=float).sum(axis=2)
    ys, xs = np.nonzero(a >= np.percentile(a, 98))
    return ys.mean(), xs.mean()


def test_a_cell_lands_on_its_region_of_a_non_square_original(captioner, tmp_path):
    """A 120 x 60 image is seen stretched to a square; cell (r, c) of the map covers rows r*60/g..
    and columns c*120/g.. of the original, in the overlay and in the rendered frames."""
    Image.new("RGB", (120, 60), (60, 60, 60)).save(tmp_path / "wide.png")
    original = Image.open(tmp_path / "wide.png")
    [result] = captioner(tmp_path / "wide.png", return_attention=True, **SETTINGS)
    g = result["attention"].shape[-1]
    assert result["attention"].shape[1:] == (g, g)
    row, col = 0, g - 1  # the top-right cell
    one_hot = np.zeros((g, g))
    one_hot[row, col] = 1.0

    up = V.upsample_map(one_hot, original.size)  # (H, W) = (60, 120)
    assert up.shape == (60, 120)
    y, x = np.unravel_index(up.argmax(), up.shape)
    assert row * 60 / g <= y < (row + 1) * 60 / g and col * 120 / g <= x < (col + 1) * 120 / g

    shown = V.overlay(original, one_hot)
    assert shown.size == (120, 60)
    y, x = _bright(shown)
    assert y < 60 / g + 2 and x >= 120 * (g - 1) / g - 2

    # through render(): the frames show the original's aspect, scaled for display, the map on the right spot
    words = caption_tokens(result["generated_text"]) or ["x"]
    fake = {"tokens": words, "attention": np.stack([one_hot] * len(words)), "locations": [(row, col)] * len(words)}
    first = captioner.render(original, fake)[0]
    width = first.width
    assert width == 2 * 256  # short side scaled to 256, aspect kept
    picture = first.crop((0, 0, width, 256))
    y, x = _bright(picture)
    assert y < 256 / g + 4 and x >= width * (g - 1) / g - 4


def test_an_empty_caption_still_renders(captioner, tmp_path):
    """A model that emits the end token first: a one-frame GIF and a one-panel grid, not an error."""
    image = Image.new("RGB", (64, 64), (50, 80, 110))
    g = 4
    empty = {"tokens": [captioner.vocab.EOS], "attention": np.full((1, g, g), 1 / g**2), "locations": [(0, 0)]}
    assert len(captioner.render(image, empty)) == 1
    path = captioner.render(image, empty, tmp_path / "empty.png", format="png")
    with Image.open(path) as png:
        assert png.size == V.render_grid(image, ["x"], np.ones((1, g, g))).size


def test_defaults_follow_hugging_face(captioner, images):
    assert captioner.generation.num_beams == 1  # greedy unless asked
    torch.manual_seed(0)
    [sampled] = captioner(str(images[0]), do_sample=True, max_new_tokens=8)  # works without num_beams=1
    assert isinstance(sampled["generated_text"], str) and sampled["tokens"]
    with pytest.raises(ConfigError, match="do_sample works with one beam"):
        captioner(str(images[0]), do_sample=True, num_beams=3)


def test_the_docstring_lists_every_decoding_option_and_the_call_checks_them(captioner, images):
    """Captioner.__call__'s docstring is built from GenerationConfig's fields: each named with its bounds."""
    from captioning.decoding.generation import generation_options

    doc = Captioner.__call__.__doc__
    assert "{generation_options}" not in doc
    for option in generation_options():
        assert f"- {option.name} ({option.expected()}; default {option.default!r}): {option.help}" in doc, option.name
    with pytest.raises(ConfigError, match=r"^temperature: expected a finite number > 0, got nan$"):
        captioner(str(images[0]), do_sample=True, temperature=float("nan"))
