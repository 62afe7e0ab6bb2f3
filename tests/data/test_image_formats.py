"""What every image route opens, and what one image can cost: the accepted formats only (never a
format that calls out to another program), any decoder failure as a one-line ImageError of that
file, and 16-bit / floating-point images converted in bounded memory."""

import subprocess
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from captioning.data.images import IMAGE_FORMATS, load_image
from captioning.errors import ImageError

EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nnewpath 0 0 moveto 8 8 lineto stroke showpage\n%%EOF\n"


def test_postscript_is_refused_without_running_anything(tmp_path, monkeypatch):
    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"a subprocess was started: {args!r}")

    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    monkeypatch.setattr(subprocess, "check_call", no_subprocess)
    path = tmp_path / "upload.jpg"  # the name says JPEG; the bytes are EPS
    path.write_bytes(EPS)
    with pytest.raises(ImageError) as err:
        load_image(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    assert "PostScript/EPS is not an accepted image format" in message


@pytest.mark.parametrize("fmt", ["PPM", "ICO", "TGA", "PCX"])
def test_formats_outside_the_list_are_refused(tmp_path, fmt):
    path = tmp_path / f"x.{fmt.lower()}"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(path, fmt)
    with Image.open(path) as img:  # Pillow itself reads it
        assert img.format == fmt
    with pytest.raises(ImageError, match="not an image file of an accepted format"):
        load_image(path)


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_every_accepted_format_opens(tmp_path, fmt):
    path = tmp_path / f"x.{fmt.lower()}"
    Image.new("RGB", (8, 6), (10, 200, 10)).save(path, fmt)
    assert load_image(path).size == (8, 6)


@pytest.mark.parametrize("error", [NotImplementedError, OverflowError, IndexError, KeyError, TypeError])
def test_any_decoder_failure_is_an_image_error_of_that_file(tmp_path, monkeypatch, error):
    path = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(path)
    monkeypatch.setattr(Image.Image, "load", lambda self: (_ for _ in ()).throw(error("decoder broke")))
    with pytest.raises(ImageError) as err:
        load_image(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value) and "unreadable image" in str(err.value)


@pytest.mark.parametrize("mode", ["I;16", "I", "F"])
def test_high_bit_depth_images_convert_in_bounded_memory(tmp_path, mode):
    side = 2048  # 4.2 megapixels
    rng = np.random.default_rng(0)
    values = rng.integers(0, 65536, (side, side))
    if mode == "F":
        values = values / 65535.0
    img = Image.fromarray(values.astype({"I;16": np.uint16, "I": np.int32, "F": np.float32}[mode]))
    img = img.convert("I;16") if mode == "I;16" else img
    path = tmp_path / "deep.tiff"
    img.save(path, "TIFF")
    tracemalloc.start()
    try:
        out = load_image(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.mode == "RGB" and out.size == (side, side)
    # What Python allocates (traced): the file's pixel data as Pillow reads it (2 or 4 bytes a pixel),
    # the 8-bit result (1 byte a pixel) and one band of rows at a time; a whole-image float64 copy
    # alone would be 8 bytes a pixel more (the conversion used to peak at 24 bytes a pixel).
    stored = 2 if mode == "I;16" else 4
    assert peak < (stored + 2.5) * side * side, f"{peak / side / side:.1f} bytes a pixel"
    expected = {
        "I;16": lambda v: (v + 128) // 257,
        "I": lambda v: np.rint(np.clip(v, 0, 65535) / 257.0),
        "F": lambda v: np.rint(v.astype(np.float32).astype(np.float64) * 255.0),
    }[mode](values)
    np.testing.assert_array_equal(np.asarray(out)[..., 0], np.clip(expected, 0, 255).astype(np.uint8))
