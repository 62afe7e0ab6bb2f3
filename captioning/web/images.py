"""An upload read into what the worker needs, and images as data URIs for the JSON answer."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

from PIL import Image

DISPLAY_SIDE = 400  # the longest side of the copy kept for the GIF and the page (a 4:3 upload: 400 x 300)
PNG_PIXELS = 256 * 256  # a display copy this small is sent as PNG, a larger one as JPEG


def prepare(path: str, inputs: Sequence[tuple[int, str]]) -> tuple[Image.Image, Image.Image, tuple[int, int]]:
    """Read an upload safely and shrink it at once: (model input, display copy, original (W, H)).

    ``inputs``: the (S, filter) of each resize the captioner makes of an image (one per member of
    an ensemble: :func:`captioning.web.served.model_inputs`). The caption must be the one the
    original image gets from ``captioning caption``. When every resize is the same, the model input
    is the image resized so, S x S, exactly as ``captioning.data.images.to_pixels`` resizes (the
    captioner's own resize of an S x S image is then a copy). When they differ (an ensemble of
    members that read different sizes or filters), a resize for one would be resized again for the
    others, so the model input is the decoded image itself, each member's resize made from it.

    Otherwise the full-size image lives only inside this call: the display copy is resized from it
    and it is dropped before the call returns, so the worker, which reads one upload at a time,
    holds at most one decoded upload (docs/WEB.md gives the peak memory of a decode).
    """
    from captioning.data.images import INTERPOLATIONS, check_interpolation, load_image

    image = load_image(path)  # bomb guard, EXIF orientation, any mode -> RGB; ImageError otherwise
    size = image.size
    if len(set(inputs)) == 1:
        [(image_size, interpolation)] = set(inputs)
        model_input = image.resize((image_size, image_size), INTERPOLATIONS[check_interpolation(interpolation)])
    else:
        model_input = image
    display = image
    if max(size) > DISPLAY_SIDE:  # resized from the image itself: no full-size copy
        scale = DISPLAY_SIDE / max(size)
        shown = (max(1, round(size[0] * scale)), max(1, round(size[1] * scale)))
        display = image.resize(shown, Image.Resampling.LANCZOS, reducing_gap=2.0)
    del image
    return model_input, display, size


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def encode_display(image: Image.Image) -> str:
    """The image as the model read it (oriented, RGB), for the page to draw the maps on: PNG when
    small, else JPEG."""
    buffer = io.BytesIO()
    if image.width * image.height <= PNG_PIXELS:
        image.save(buffer, "PNG")
        return data_uri(buffer.getvalue(), "image/png")
    image.save(buffer, "JPEG", quality=90)
    return data_uri(buffer.getvalue(), "image/jpeg")
