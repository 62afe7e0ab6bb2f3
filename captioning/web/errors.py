"""The web server's errors: one type per HTTP status, so that the status comes from the type.

Every answer the server refuses is a :class:`RequestError` whose class holds its status (and the
headers that go with it); the app and the middlewares answer ``{"error": str(err)}`` with
``err.status`` and ``err.headers``, and nothing matches an error's text to choose a status:

=====  ============================  =====================================================
400    :class:`RequestError`         a bad field, an unreadable image, a malformed form
404    :class:`NotFound`             an unknown model, route or example
405    :class:`MethodNotAllowed`     a method a route does not take
408    :class:`BodyTimeout`          the body not sent in time (the connection is closed)
413    :class:`TooLarge`             an upload or an image over the server's limits
415    :class:`UnsupportedMedia`     not an image, not a multipart form
500    :class:`InternalError`        the server failed on the request (the detail is logged)
503    :class:`Busy`                 too many requests, or the model did not answer in time
=====  ============================  =====================================================
"""

from __future__ import annotations

import re
from typing import ClassVar

from captioning.errors import CaptioningError, ImageError

MB = 1024 * 1024


class RequestError(CaptioningError):
    """A request the server cannot answer (HTTP 400): a one-line message for the client."""

    status: ClassVar[int] = 400
    headers: ClassVar[dict[str, str]] = {}


class NotFound(RequestError):
    """An unknown model, route or example (HTTP 404)."""

    status = 404


class MethodNotAllowed(RequestError):
    """A method the route does not take (HTTP 405)."""

    status = 405


class BodyTimeout(RequestError):
    """The request's body was not sent in time (HTTP 408); the connection is closed."""

    status = 408
    headers = {"Connection": "close"}

    def __init__(self, seconds: float):
        super().__init__(f"the request's body was not sent within {seconds:g} s")


class TooLarge(RequestError):
    """An upload or a decoded image over the server's limits (HTTP 413)."""

    status = 413


class UploadTooLarge(TooLarge):
    """An upload over ``--max-upload-mb`` (HTTP 413)."""

    def __init__(self, limit: int):
        super().__init__(f"upload too large: the limit is {limit / MB:g} MB")


class UnsupportedMedia(RequestError):
    """A file that is not an image, or a body that is not a multipart form (HTTP 415)."""

    status = 415


class InternalError(RequestError):
    """The server failed on a request (HTTP 500): a generic message; the detail is logged."""

    status = 500

    def __init__(self, what: str = "the model failed on this request"):
        super().__init__(f"internal error: {what} (the server's log has the detail)")


class Busy(RequestError):
    """Too many requests are waiting, or the model did not answer in time: come back later (HTTP 503)."""

    status = 503
    headers = {"Retry-After": "1"}


# The loader (captioning.data.images.load_image) raises one ImageError type for every unreadable
# file; these are the loader's phrases that tell a refused format (415) and a refused size (413)
# from a damaged file (400).
_NOT_AN_IMAGE = ("not an image", "not an accepted image format")
_TOO_MANY_PIXELS = ("decompression bomb", "exceeds the limit")


def upload_error(err: ImageError, upload: str, filename: str) -> RequestError:
    """The answer to an upload the image loader refused: its message with the client's file name for
    the server's temporary file (see :func:`client_message`), typed by what was wrong with it."""
    message = client_message(str(err), upload, filename)
    if any(phrase in message for phrase in _NOT_AN_IMAGE):
        return UnsupportedMedia(message)
    if any(phrase in message for phrase in _TOO_MANY_PIXELS):
        return TooLarge(message)
    return RequestError(message)


def client_message(message: str, upload: str, filename: str) -> str:
    """An image error as the web client reads it: the client's file name for the server's temporary
    file, and the server's own option (--max-pixels) as the limit of a refused large image."""
    message = message.replace(upload, filename)
    return re.sub(
        r"\(possible decompression bomb;.*\)$",
        "(possible decompression bomb; the server's limit, set by its --max-pixels option)",
        message,
    )
