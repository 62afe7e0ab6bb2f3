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


# ------------------------------------------------------------------------------ JPEGs decoded on a GPU
# ``decode_device`` (``--data.decode_device cuda``, ``caption --decode-device cuda``): the loader's
# workers read a JPEG file's bytes without decoding them, and the main process decodes each batch's
# JPEGs on the GPU (torchvision.io.decode_jpeg, nvJPEG) and resizes them there with torch's
# antialiased filter, the same resize as Pillow's within a level or two of 255 (tested on the CPU,
# where torchvision decodes with libjpeg). Anything the device route would not read as the CPU route
# does (another format, CMYK, an EXIF rotation, bytes after the end marker, a truncated file, a
# size over the pixel limit) is decoded on the CPU by the worker as before, and a JPEG the device
# cannot decode is decoded from its bytes by Pillow; the batch holds both kinds of rows.

#: the resize filters the device route reproduces (Pillow's name -> torch's antialiased mode)
DEVICE_RESIZES = {"bilinear": "bilinear", "bicubic": "bicubic"}
_JPEG_START, _JPEG_END = b"\xff\xd8\xff", b"\xff\xd9"
_EXIF_ORIENTATION = 0x0112


def check_decode_device(device, option: str = "--decode-device", interpolation: str | None = None):
    """None for ``"cpu"`` or None (Pillow decodes in the loader, the default); the torch device of a
    CUDA name (``cuda``, ``cuda:1``). One line of ConfigError naming ``option`` for anything else, for
    CUDA where no CUDA GPU is available, and for a resize the device route does not reproduce."""
    if device is None or str(device) == "cpu":
        return None
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{option} {device}: expected cpu or cuda (cuda:N)") from None
    if parsed.type != "cuda":
        raise ConfigError(f"{option} {device}: JPEGs are decoded on the CPU (cpu) or a CUDA GPU (cuda, cuda:N)")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ConfigError(f"{option} {device}: no CUDA GPU is available here; decode on the CPU ({option} cpu)")
    if parsed.index is not None and parsed.index >= count:
        raise ConfigError(f"{option} {device}: this machine has {count} CUDA GPU(s)")
    if interpolation is not None and interpolation not in DEVICE_RESIZES:
        raise ConfigError(
            f"{option} {device}: the model resizes with {interpolation}, which the GPU route does not "
            f"reproduce (it resizes with {' or '.join(DEVICE_RESIZES)}); decode on the CPU ({option} cpu)"
        )
    return parsed


def jpeg_for_device(data: bytes) -> bool:
    """Whether the device route reads these file bytes as the CPU route would: a whole JPEG (start and
    end markers, nothing after), RGB or grey, no EXIF rotation, within Pillow's pixel limit (its
    header read only; nothing is decoded)."""
    if not (data.startswith(_JPEG_START) and data.endswith(_JPEG_END)):
        return False
    import io

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=("JPEG",)) as img:
                if img.mode not in ("RGB", "L") or img.width * img.height > (Image.MAX_IMAGE_PIXELS or 1 << 62):
                    return False
                return img.getexif().get(_EXIF_ORIENTATION, 1) == 1
    except Exception:  # noqa: BLE001 -- anything odd goes the CPU route, which says what is wrong
        return False


def jpeg_file_bytes(path: PathLike):
    """The file's bytes as a uint8 tensor (N,) if the device route may decode it (:func:`jpeg_for_device`),
    else None (the CPU route reads it, and reports what is wrong with it)."""
    import torch

    path = os.fspath(path)
    if os.path.splitext(path)[1].lower() not in (".jpg", ".jpeg", ".jpe", ".jfif"):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if not jpeg_for_device(data):
        return None
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def pack_jpegs(visual: list, names: list[str]) -> dict:
    """A batch's visual inputs, some JPEG bytes (1-D uint8 tensors), the others decoded on the CPU
    ((3, S, S) float tensors) -> the batch's entries: ``images`` (K, 3, S, S) and ``image_rows`` (K,)
    of the decoded rows, ``jpeg`` (all bytes, concatenated), ``jpeg_offsets`` (J + 1,), ``jpeg_rows``
    (J,) and ``jpeg_names``. :func:`decode_batch` turns them into the batch's ``images``."""
    import torch
    from torch.utils.data import default_collate

    jpeg_rows = [i for i, v in enumerate(visual) if v.dim() == 1]
    image_rows = [i for i, v in enumerate(visual) if v.dim() != 1]
    lengths = [len(visual[i]) for i in jpeg_rows]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return {
        "images": default_collate([visual[i] for i in image_rows]) if image_rows else torch.zeros(0),
        "image_rows": torch.tensor(image_rows, dtype=torch.long),
        "jpeg": torch.cat([visual[i] for i in jpeg_rows]) if jpeg_rows else torch.zeros(0, dtype=torch.uint8),
        "jpeg_offsets": torch.from_numpy(offsets),
        "jpeg_rows": torch.tensor(jpeg_rows, dtype=torch.long),
        "jpeg_names": [names[i] for i in jpeg_rows],
    }


def _decode_one_on_cpu(data, name: str):
    """A JPEG the device could not decode, by the CPU route (Pillow, data/images.py's rules): uint8
    (3, H, W); ImageError naming it if it cannot be read."""
    import io

    import torch

    try:
        with Image.open(io.BytesIO(bytes(data.numpy())), formats=IMAGE_FORMATS) as img:
            img.load()
            rgb = to_rgb(img)
    except Exception as err:  # noqa: BLE001 -- as load_image: a decoder may raise anything
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        raise ImageError(f"{name}: unreadable image, damaged or truncated ({detail})") from None
    return torch.from_numpy(np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1).copy())


def decode_jpegs(jpegs: list, names: list[str], device) -> tuple[list, list[str | None]]:
    """Decode JPEG bytes (1-D uint8 CPU tensors) on ``device``, as a batch: (uint8 (3, H, W) images on
    ``device``, None where unreadable; the one-line error of each, None where read). A batch the
    device refuses is decoded one image at a time, and an image it refuses by Pillow on the CPU."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if not jpegs:
        return [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchvision 0.29 marks its decoders deprecated (TorchCodec)
        try:
            images = decode_jpeg(list(jpegs), mode=ImageReadMode.RGB, device=device)
            return list(images), [None] * len(jpegs)
        except RuntimeError:
            pass
        images, errors = [], []
        for data, name in zip(jpegs, names):
            try:
                images.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
                errors.append(None)
                continue
            except RuntimeError:
                pass
            try:
                images.append(_decode_one_on_cpu(data, name).to(device))
                errors.append(None)
            except ImageError as err:
                images.append(None)
                errors.append(str(err))
    return images, errors


def resize_on_device(image, image_size: int, interpolation: str = DEFAULT_INTERPOLATION):
    """uint8 (3, H, W) -> uint8 (3, S, S) on the image's device: torch's antialiased ``interpolation``
    (one of :data:`DEVICE_RESIZES`), rounded as Pillow rounds; no crop, as :func:`to_pixels`."""
    import torch

    mode = DEVICE_RESIZES[interpolation]
    if tuple(image.shape[1:]) == (image_size, image_size):
        return image
    out = torch.nn.functional.interpolate(
        image[None].float(), size=(image_size, image_size), mode=mode, antialias=True, align_corners=False
    )
    return out[0].round_().clamp_(0, 255).to(torch.uint8)


def decode_batch(batch: dict, device, image_size: int, interpolation: str = DEFAULT_INTERPOLATION) -> dict:
    """A batch of :func:`pack_jpegs`' entries -> the batch with ``images`` (B, 3, S, S) float in [0, 1]
    on ``device``, the rows the CPU decoded and the JPEGs decoded there, in batch order. An unreadable
    JPEG's row is removed (with its captions) and its error appended to ``bad_images``, as the loader
    does for the images it cannot read. A batch without JPEG entries is returned as it is."""
    import torch

    if "jpeg_rows" not in batch:
        return batch
    offsets = batch.pop("jpeg_offsets").tolist()
    data, jpeg_rows, names = batch.pop("jpeg"), batch.pop("jpeg_rows").tolist(), batch.pop("jpeg_names")
    image_rows, decoded = batch.pop("image_rows").tolist(), batch.pop("images")
    rows = len(jpeg_rows) + len(image_rows)
    jpegs = [data[offsets[k] : offsets[k + 1]] for k in range(len(jpeg_rows))]
    images, errors = decode_jpegs(jpegs, names, device)
    out = torch.empty(rows, 3, image_size, image_size, device=device)
    if image_rows:
        out[image_rows] = decoded.to(device, non_blocking=True).float()
    for row, image in zip(jpeg_rows, images):
        if image is not None:
            out[row] = resize_on_device(image, image_size, interpolation).float().div_(255.0)
    batch["images"] = out
    bad = [row for row, error in zip(jpeg_rows, errors) if error is not None]
    if bad:
        batch["bad_images"] = list(batch.get("bad_images", [])) + [e for e in errors if e is not None]
        batch = drop_rows(batch, bad, rows)
    return batch


def drop_rows(batch: dict, rows: list[int], size: int) -> dict:
    """The batch without the image rows ``rows`` (of ``size``): their images, ids and captions (every
    caption of a grouped batch's image: ``image_index``)."""
    import torch

    keep = torch.ones(size, dtype=torch.bool)
    keep[rows] = False
    out = dict(batch)
    for key in ("images", "image_ids"):
        out[key] = batch[key][keep.to(batch[key].device)]
    if "image_index" in batch:  # grouped: captions follow their image's row
        index = batch["image_index"]
        caption_keep = keep[index]
        new_row = torch.cumsum(keep.long(), 0) - 1
        out["image_index"] = new_row[index[caption_keep]]
    else:
        caption_keep = keep
    for key in ("captions", "lengths"):
        if key in batch:
            out[key] = batch[key][caption_keep]
    return out


def decode_entries(entries: list, names: list[str], sizes, device) -> tuple[list, list[str | None]]:
    """The GPU route of the streaming commands (``caption --decode-device``).

    Each entry is what a loader read (data/inputs.py): a JPEG's bytes as a 1-D uint8 array, or one
    uint8 (3, S, S) array per (size, interpolation) of ``sizes``. Returns, per entry, a tuple of one
    image per size (the JPEGs decoded and resized on ``device`` as uint8 tensors, the others as
    they were; None where unreadable), and the one-line error of each (None where read)."""
    import torch

    rows = [i for i, e in enumerate(entries) if isinstance(e, np.ndarray) and e.ndim == 1]
    out, errors = list(entries), [None] * len(entries)
    decoded, problems = decode_jpegs([torch.from_numpy(entries[i]) for i in rows], [names[i] for i in rows], device)
    for i, image, problem in zip(rows, decoded, problems):
        out[i] = None if image is None else tuple(resize_on_device(image, s, f) for s, f in sizes)
        errors[i] = problem
    return out, errors
