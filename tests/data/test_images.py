import numpy as np
import pytest
import torch
from PIL import Image

from captioning.data.images import load_image, to_tensor
from captioning.errors import ConfigError, ImageError, ImageTooLargeError, NotAnImageError


def noise(w, h, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def image_error(path):
    with pytest.raises(ImageError) as info:
        load_image(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_rgb_jpeg_and_1x1(tmp_path):
    noise(40, 30).save(tmp_path / "a.jpg")
    img = load_image(tmp_path / "a.jpg")
    assert img.mode == "RGB" and img.size == (40, 30)
    Image.new("RGB", (1, 1), (10, 20, 30)).save(tmp_path / "one.png")
    assert load_image(str(tmp_path / "one.png")).getpixel((0, 0)) == (10, 20, 30)


def test_missing_directory_and_empty(tmp_path):
    assert image_error(tmp_path / "x.jpg") == f"{tmp_path / 'x.jpg'}: no such file"
    assert "directory" in image_error(tmp_path)
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert "empty file" in image_error(tmp_path / "empty.jpg")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_files_are_errors_not_padded(tmp_path, fmt):
    whole = tmp_path / f"whole.{fmt.lower()}"
    noise(64, 48).save(whole, format=fmt)
    data = whole.read_bytes()
    cut = tmp_path / f"cut.{fmt.lower()}"
    cut.write_bytes(data[: len(data) * 2 // 3])
    assert "truncated" in image_error(cut)


def test_text_html_and_unsupported_files(tmp_path):
    (tmp_path / "page.jpg").write_text("<!DOCTYPE html><html><body>404 Not Found</body></html>")
    assert "not an image file (HTML/XML text" in image_error(tmp_path / "page.jpg")
    (tmp_path / "v.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>')
    assert "not an image file (SVG" in image_error(tmp_path / "v.svg")
    (tmp_path / "r.png").write_bytes(bytes(range(256)) * 4)
    assert "not an image file" in image_error(tmp_path / "r.png")


def test_decompression_bomb_is_refused(tmp_path, monkeypatch):
    Image.new("RGB", (64, 48)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # 3072 pixels: over the limit, under twice it
    message = image_error(tmp_path / "big.png")
    assert "3,072 pixels" in message and "limit of 2,000 pixels" in message and "decompression bomb" in message
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # over twice the limit: Pillow's own error
    assert "3,072 pixels exceeds the limit of 1,000" in image_error(tmp_path / "big.png")


def test_the_error_type_says_why(tmp_path, monkeypatch):
    """Too many pixels and not an image are subclasses of ImageError (the web server answers 413 and
    415 by type); a damaged image of an accepted format is neither."""
    Image.new("RGB", (64, 48)).save(tmp_path / "big.png")
    (tmp_path / "page.jpg").write_text("<html></html>")
    noise(64, 48).save(tmp_path / "whole.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "whole.png").read_bytes()[:300])
    with pytest.raises(NotAnImageError):
        load_image(tmp_path / "page.jpg")
    with pytest.raises(ImageError) as info:
        load_image(tmp_path / "cut.png")
    assert not isinstance(info.value, (ImageTooLargeError, NotAnImageError))
    for limit in (2000, 1000):  # Pillow's warning and its error alike
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)
        with pytest.raises(ImageTooLargeError):
            load_image(tmp_path / "big.png")


def test_grey_cmyk_and_palette(tmp_path):
    Image.new("L", (5, 4), 77).save(tmp_path / "g.png")
    assert load_image(tmp_path / "g.png").getpixel((0, 0)) == (77, 77, 77)
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(tmp_path / "c.jpg", quality=100)
    r, g, b = load_image(tmp_path / "c.jpg").getpixel((4, 4))
    assert r > 240 and g < 15 and b < 15
    pal = Image.new("P", (4, 4))
    pal.putpalette([0, 0, 0, 0, 200, 0] + [0] * 762)
    pal.putpixel((1, 1), 1)
    pal.save(tmp_path / "p.png")
    img = load_image(tmp_path / "p.png")
    assert img.getpixel((1, 1)) == (0, 200, 0) and img.getpixel((0, 0)) == (0, 0, 0)


def test_alpha_is_composited_on_white(tmp_path):
    rgba = Image.new("RGBA", (2, 1), (255, 0, 0, 255))
    rgba.putpixel((1, 0), (255, 0, 0, 0))  # fully transparent
    rgba.save(tmp_path / "a.png")
    img = load_image(tmp_path / "a.png")
    assert img.getpixel((0, 0)) == (255, 0, 0) and img.getpixel((1, 0)) == (255, 255, 255)
    Image.new("LA", (1, 1), (0, 128)).save(tmp_path / "la.png")  # black at half opacity -> mid grey
    assert all(abs(v - 127) <= 1 for v in load_image(tmp_path / "la.png").getpixel((0, 0)))
    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 255, 0, 255, 0] + [0] * 762)
    pal.putpixel((1, 0), 1)
    pal.info["transparency"] = 0
    pal.save(tmp_path / "pt.png", transparency=0)
    img = load_image(tmp_path / "pt.png")
    assert img.getpixel((0, 0)) == (255, 255, 255) and img.getpixel((1, 0)) == (0, 255, 0)


def test_16_bit_png_is_scaled_not_clipped(tmp_path):
    grey = np.array([[0, 257 * 128, 65535, 1000]], dtype=np.uint16)
    Image.fromarray(grey).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    img = load_image(tmp_path / "deep.png")
    assert [img.getpixel((x, 0))[0] for x in range(4)] == [0, 128, 255, 4]


def test_float_image_in_unit_range_is_scaled(tmp_path):
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32), "F").save(tmp_path / "f.tif")
    img = load_image(tmp_path / "f.tif")
    assert [img.getpixel((x, 0))[0] for x in range(3)] == [0, 128, 255]


def test_exif_orientation_is_honoured(tmp_path):
    img = Image.new("RGB", (40, 20), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 20, 20))  # left half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display = rotate 90 degrees clockwise
    img.save(tmp_path / "rot.jpg", exif=exif.tobytes(), quality=95)
    out = load_image(tmp_path / "rot.jpg")
    assert out.size == (20, 40)
    top, bottom = out.getpixel((10, 5)), out.getpixel((10, 35))
    assert top[2] > 200 and top[0] < 50  # the stored left (blue) half is now on top
    assert bottom[0] > 200 and bottom[2] < 50


def test_animated_gif_gives_first_frame(tmp_path):
    frames = [Image.new("RGB", (6, 6), c) for c in ((255, 0, 0), (0, 0, 255), (0, 255, 0))]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    img = load_image(tmp_path / "anim.gif")
    assert img.mode == "RGB" and img.getpixel((3, 3)) == (255, 0, 0)


def test_result_does_not_keep_the_file_open(tmp_path):
    noise(8, 8).save(tmp_path / "a.png")
    img = load_image(tmp_path / "a.png")
    (tmp_path / "a.png").unlink()
    assert img.copy().size == (8, 8)


def test_to_tensor_stretches_without_crop():
    img = Image.new("RGB", (40, 10), (0, 0, 0))
    img.paste((255, 255, 255), (20, 0, 40, 10))  # right half white
    x = to_tensor(img, 8)
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert torch.allclose(x[:, :, :3], torch.zeros(3, 8, 3)) and torch.allclose(x[:, :, 5:], torch.ones(3, 8, 3))
    assert to_tensor(Image.new("L", (3, 3), 255), 4).shape == (3, 4, 4)


@pytest.mark.parametrize("size", [0, -1, 2.5, True])
def test_to_tensor_rejects_bad_sizes(size):
    with pytest.raises(ConfigError):
        to_tensor(Image.new("RGB", (2, 2)), size)
