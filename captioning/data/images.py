"""Reading images robustly, and turning them into the tensors the encoder takes.

``load_image`` gives an RGB image for every file Pillow can decode: EXIF orientation is applied,
animated images give their first frame, transparency is composited over white, 16-bit and
floating-point images are scaled to 8 bits. Anything else (missing, empty, truncated, not an
image, a decompression bomb, a format outside :data:`IMAGE_FORMATS`) raises :class:`ImageError`
with one line naming the file. Truncated files are never padded silently:
``ImageFile.LOAD_TRUNCATED_IMAGES`` is left alone.

Only the formats of :data:`IMAGE_FORMATS` are ever opened, on every route (files, uploads,
datasets): Pillow's other plugins include formats that call out to other programs (EPS and PS
run Ghostscript) or that nobody captions. Whatever a decoder raises on a damaged file becomes an
:class:`ImageError` of that file, so one bad image never fails the images read beside it.
"""

from __future__ import annotations

import glob
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from captioning.common import PathLike
from captioning.errors import ConfigError, ImageError, ImageTooLargeError, NotAnImageError
from captioning.files import require_file

if TYPE_CHECKING:
    import torch

#: the image formats every route opens (Pillow's format names); nothing else is handed to a decoder
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")

#: file signatures of formats that are refused by name (the message says which and why)
_REFUSED_SIGNATURES = (
    (b"%!PS", "PostScript/EPS"),
    (b"\xc5\xd0\xd3\xc6", "EPS"),
    (b"%PDF", "PDF"),
)

#: pixels converted at a time from 16-bit and floating-point images (bounds the temporary arrays)
_BAND_PIXELS = 1 << 20


def _describe_bomb(err: Exception) -> str:
    """Pixel count and limit of a refused image, from Pillow's decompression-bomb message."""
    match = re.search(r"\((\d+) pixels\)", str(err))
    pixels = f"{int(match.group(1)):,} pixels" if match else "too many pixels"
    return (
        f"refused: {pixels} exceeds the limit of {Image.MAX_IMAGE_PIXELS:,} pixels "
        "(possible decompression bomb; allow larger images with --max-image-pixels N, in Python PIL.Image.MAX_IMAGE_PIXELS)"
    )


def _not_an_image(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(512).lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<?xml", b"<svg")):
        kind = "SVG" if b"<svg" in head else "HTML/XML"
        return f"not an image file ({kind} text; cannot identify image format)"
    for signature, kind in _REFUSED_SIGNATURES:
        if head.startswith(signature.lower()):
            return f"refused: {kind} is not an accepted image format (accepted: {', '.join(IMAGE_FORMATS)})"
    return f"not an image file of an accepted format ({', '.join(IMAGE_FORMATS)}; cannot identify image format)"


def _grey_bands(img: Image.Image, convert) -> Image.Image:
    """A one-channel high-bit-depth image -> 8-bit grey ("L"), ``convert`` (values array -> uint8
    array) applied to bands of rows, so that the temporary arrays stay small whatever the size."""
    width, height = img.size
    out = np.empty((height, width), dtype=np.uint8)
    rows = max(1, _BAND_PIXELS // max(1, width))
    for top in range(0, height, rows):
        bottom = min(height, top + rows)
        out[top:bottom] = convert(np.asarray(img.crop((0, top, width, bottom))))
    return Image.fromarray(out, "L")


def _to_rgb(img: Image.Image) -> Image.Image:
    """Any Pillow mode -> a new RGB image; alpha over white, high bit depths scaled to 8 bits."""
    if img.mode.startswith("I;16"):  # 16-bit grey: 0..65535 -> 0..255, rint(x / 257) in integers (no ties)
        return _grey_bands(img, lambda x: ((x.astype(np.uint32) + 128) // 257).astype(np.uint8)).convert("RGB")
    if img.mode in ("I", "F"):  # 32-bit int or float grey: guess the range from the values
        top = img.getextrema()[1] if img.width and img.height else 0
        if img.mode == "F" and top <= 1.0:
            scaled = lambda g: g * 255.0  # noqa: E731 -- [0, 1] floats
        elif top > 255.0:
            scaled = lambda g: np.clip(g, 0, 65535) / 257.0  # noqa: E731 -- 16-bit values stored as 32-bit
        else:
            scaled = lambda g: g  # noqa: E731
        return _grey_bands(
            img, lambda x: np.clip(np.rint(scaled(x.astype(np.float64))), 0, 255).astype(np.uint8)
        ).convert("RGB")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")  # RGB (a copy), L, 1, P, CMYK, YCbCr, LAB, HSV


def to_rgb(img: Image.Image) -> Image.Image:
    """The rules every image goes through, from a file or not: EXIF orientation applied, then any
    mode to RGB (alpha over white, high bit depths scaled to 8 bits). Returns a new image."""
    try:
        oriented = ImageOps.exif_transpose(img)
    except Exception:  # a damaged EXIF block: keep the pixels as stored
        oriented = img
    return _to_rgb(oriented if oriented is not None else img)


def array_to_image(array, what: str = "image array") -> Image.Image:
    """An (H, W), (H, W, 3|4) array or a (3|4, H, W) tensor -> RGB image, through :func:`to_rgb`.

    uint8 values are taken as they are; floating-point values must lie in [0, 1] (an image in
    [0, 255] as floats is refused rather than clipped to white); uint16 values are 16-bit.
    """
    if hasattr(array, "detach"):  # a torch tensor: channels first
        tensor = array.detach().cpu()
        tensor = tensor.double() if tensor.is_floating_point() else tensor  # bf16 has no numpy twin
        if tensor.dim() != 3 or tensor.size(0) not in (3, 4):
            raise ImageError(f"an image tensor must be (3, H, W) or (4, H, W), got shape {tuple(tensor.shape)}")
        array = tensor.permute(1, 2, 0).numpy()
    array = np.asarray(array)
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)) or 0 in array.shape:
        raise ImageError(f"an {what} must be (H, W), (H, W, 3) or (H, W, 4), got shape {array.shape}")
    if array.dtype == np.uint8:
        pixels = array
    elif array.dtype == np.uint16:
        pixels = np.rint(array / 257.0).astype(np.uint8)
    elif np.issubdtype(array.dtype, np.floating) or array.dtype == bool:
        values = array.astype(np.float64)
        if not np.isfinite(values).all():
            raise ImageError(f"the {what} holds NaN or infinite values")
        low, high = float(values.min()), float(values.max())
        if low < 0.0 or high > 1.0:
            raise ImageError(
                f"the {what}'s values must lie in [0, 1], got [{low:g}, {high:g}] (divide an image in [0, 255] by 255)"
            )
        pixels = np.rint(values * 255.0).astype(np.uint8)
    else:
        raise ImageError(f"the {what} has dtype {array.dtype}; expected uint8, uint16 or floats in [0, 1]")
    mode = "L" if array.ndim == 2 else ("RGB" if array.shape[2] == 3 else "RGBA")
    return to_rgb(Image.fromarray(np.ascontiguousarray(pixels), mode))


def load_image(path: PathLike) -> Image.Image:
    """Read ``path`` as an RGB :class:`PIL.Image.Image` (see the module docstring).

    Decompression bombs are refused when the pixel count exceeds ``PIL.Image.MAX_IMAGE_PIXELS``
    (Pillow itself only warns up to twice that).
    """
    path = os.fspath(path)
    require_file(path, ImageError, "an image file")
    if os.path.getsize(path) == 0:
        raise ImageError(f"{path}: empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path, formats=IMAGE_FORMATS) as img:
                img.load()  # decode everything now, so that truncation is detected here
                return to_rgb(img)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
        raise ImageTooLargeError(f"{path}: {_describe_bomb(err)}") from None
    except UnidentifiedImageError:
        raise NotAnImageError(f"{path}: {_not_an_image(path)}") from None
    except PermissionError:
        raise ImageError(f"{path}: cannot read (permission denied)") from None
    except Exception as err:  # noqa: BLE001 -- a decoder may raise anything on a damaged file (OSError,
        # SyntaxError, ValueError, EOFError, MemoryError, NotImplementedError, OverflowError, ...)
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        raise ImageError(f"{path}: unreadable image, damaged or truncated ({detail})") from None


#: the resampling filters an image may be resized with, by name (Pillow's filters)
INTERPOLATIONS = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}

#: the resize of models that record none (every model made before the resize was recorded)
DEFAULT_INTERPOLATION = "bilinear"


def check_interpolation(interpolation: str) -> str:
    """``interpolation`` if it names one of :data:`INTERPOLATIONS`, else a one-line ConfigError."""
    if not isinstance(interpolation, str) or interpolation not in INTERPOLATIONS:
        raise ConfigError(f"unknown interpolation {interpolation!r}; expected one of {', '.join(INTERPOLATIONS)}")
    return interpolation


def to_pixels(img: Image.Image, image_size: int, interpolation: str = DEFAULT_INTERPOLATION) -> np.ndarray:
    """RGB image -> uint8 array (3, S, S), S = ``image_size``: the one resize of every route
    (PyTorch and ONNX alike; no torch needed here).

    A plain resize with Pillow's ``interpolation`` filter (one of :data:`INTERPOLATIONS`; bilinear
    unless the model records another; antialiased when shrinking) and no crop, so an attention grid
    maps back onto the whole original image by stretching. Normalisation is the encoder's job.
    """
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ConfigError(f"image_size must be a positive integer, got {image_size!r}")
    resample = INTERPOLATIONS[check_interpolation(interpolation)]
    if img.mode != "RGB":
        img = _to_rgb(img)
    img = img.resize((image_size, image_size), resample)
    return np.ascontiguousarray(np.array(img, dtype=np.uint8).transpose(2, 0, 1))  # (S, S, 3) -> (3, S, S)


def pixels_to_float(pixels: np.ndarray) -> np.ndarray:
    """uint8 (3, S, S) -> float32 (3, S, S) in [0, 1]."""
    return pixels.astype(np.float32) / np.float32(255.0)


def to_array(img: Image.Image, image_size: int, interpolation: str = DEFAULT_INTERPOLATION) -> np.ndarray:
    """RGB image -> float32 array (3, S, S) in [0, 1], S = ``image_size`` (see :func:`to_pixels`)."""
    return pixels_to_float(to_pixels(img, image_size, interpolation))


def to_tensor(img: Image.Image, image_size: int, interpolation: str = DEFAULT_INTERPOLATION) -> torch.Tensor:
    """RGB image -> FloatTensor (3, S, S) in [0, 1], S = ``image_size`` (see :func:`to_array`)."""
    import torch

    return torch.from_numpy(to_array(img, image_size, interpolation))


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff"}


def expand_image_paths(items: Sequence[str]) -> list[str]:
    """Image paths from files, folders (their images and their subfolders', sorted by path: photos/ includes
    photos/beach/1.jpg) and glob patterns, in the order given."""
    paths = []
    for item in items:
        if os.path.isdir(item):
            paths += sorted(str(p) for p in Path(item).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif any(ch in item for ch in "*?[") and not os.path.exists(item):
            paths += sorted(glob.glob(item))
        else:
            paths.append(item)
    return paths


def load_images(paths: Sequence[str]) -> tuple[list, list]:
    """(path, PIL image) for the readable images; (path, reason) for the others."""
    good, bad = [], []
    for p in paths:
        try:
            good.append((p, load_image(p)))
        except ImageError as err:
            bad.append((p, str(err)))
    return good, bad


def as_rgb(image) -> Image.Image:
    """Any accepted image input -> RGB PIL image, by the same rules whatever the route: EXIF
    orientation, alpha over white, 16-bit and other modes scaled. A path is read with the file
    checks; an array is (H, W[, 3|4]) uint8/uint16 or floats in [0, 1]; a tensor (3|4, H, W) in
    [0, 1] (recognised without importing torch). Values outside [0, 1] are an error, not clipped."""
    if isinstance(image, (str, os.PathLike)):
        return load_image(image)
    if isinstance(image, Image.Image):
        try:
            image.load()
        except (OSError, ValueError) as err:
            raise ImageError(f"unreadable PIL image ({err})") from None
        return to_rgb(image)
    if hasattr(image, "detach"):  # a torch tensor
        return array_to_image(image, "image tensor")
    if isinstance(image, np.ndarray):
        return array_to_image(image)
    raise ImageError(f"expected a path, a PIL image, a numpy array or a tensor, got {type(image).__name__}")
