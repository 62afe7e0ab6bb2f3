"""A Python client of the web API, standard library only.

    from captioning.web.client import caption
    out = caption("photo.jpg", url="http://127.0.0.1:7860", num_beams=3, return_gif=True)
    print(out["generated_text"], out["score"])
    out["tokens"], out["attention"]          # a (gh, gw) map per token, <end> included
    save_gif(out, "photo.gif")

From the shell: ``python -m captioning.web.client photo.jpg [--url URL] [--gif photo.gif]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import mimetypes
import os
import sys
import urllib.error
import urllib.request
import uuid

DEFAULT_URL = "http://127.0.0.1:7860"


class APIError(Exception):
    """The server refused the request: ``status`` (HTTP) and its one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


def wait_for_server(url: str, proc, timeout: float) -> str | None:
    """Poll ``url``/healthz until the server ``proc`` (a Popen) answers: None once it does, else
    why not ("exited with N" or "did not answer within T s", the process then terminated)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/healthz", timeout=2) as answer:
                if answer.status == 200:
                    return None
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.terminate()
            return f"did not answer within {timeout:.0f} s"
        time.sleep(0.3)


def encode_multipart(fields: dict, filename: str, data: bytes, content_type: str | None = None) -> tuple[bytes, str]:
    """(body, Content-Type header) of a multipart form with ``fields`` and the file as field ``image``."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        if value is None:
            continue
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    ctype = content_type or mimetypes.guess_type(filename)[0] or "application/octet-stream"
    safe = filename.replace('"', "_").replace("\r", "_").replace("\n", "_")
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{safe}"\r\n'
        f"Content-Type: {ctype}\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def caption(
    image: str | os.PathLike | bytes,
    url: str = DEFAULT_URL,
    model: str | None = None,
    return_gif: bool = False,
    return_image: bool = False,
    filename: str | None = None,
    timeout: float = 120.0,
    return_views: bool = False,
    **settings,
) -> dict:
    """POST an image (a path or its bytes) to ``url``/api/caption and return the JSON answer.

    ``settings``: the decoding fields of the API (num_beams, max_new_tokens, length_penalty,
    attention_mode, num_return_sequences, prefix, ... every field docs/WEB.md lists; None: the
    model's own) and the steering fields ``focus`` (a box (x0, y0, x1, y1) in the image's pixels)
    and ``focus_strength``, sent as the form's text (booleans as true/false, lists and boxes
    comma-separated). ``return_views``: the answer's "views" (docs/WEB.md).
    Raises :class:`APIError` when the server answers with an error status.
    """
    fields = {
        "model": model,
        **{key: _form_text(value) for key, value in settings.items()},
        "return_gif": "1" if return_gif else None,
        "return_image": "1" if return_image else None,
        "return_views": "1" if return_views else None,
    }
    return _post(url, "/api/caption", image, fields, filename, timeout)


def atlas(
    image: str | os.PathLike | bytes,
    url: str = DEFAULT_URL,
    word: str | None = None,
    example: int | None = None,
    filename: str | None = None,
    timeout: float = 120.0,
) -> dict:
    """POST an image to ``url``/api/atlas: every served model's panel on it (docs/WEB.md). ``word``: the
    word the panels show (default: the first object word the captions share); ``example``: the index
    of the server's example image this is (its objects give each caption's object F1)."""
    fields = {"word": word, "example": None if example is None else str(example)}
    return _post(url, "/api/atlas", image, fields, filename, timeout)


def _post(url: str, route: str, image, fields: dict, filename: str | None, timeout: float) -> dict:
    """POST ``image`` (a path or its bytes) and the form's ``fields`` to ``route``; the JSON answer,
    or :class:`APIError`."""
    if isinstance(image, (bytes, bytearray)):
        data, name = bytes(image), filename or "image"
    else:
        with open(image, "rb") as f:
            data = f.read()
        name = filename or os.path.basename(os.fspath(image))
    body, content_type = encode_multipart(fields, name, data)
    request = urllib.request.Request(
        url.rstrip("/") + route, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            message = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            message = raw.decode("utf-8", "replace")[:300]
        raise APIError(err.code, message) from None


def _form_text(value):
    """A setting as the form's text: booleans as true/false, lists and tuples comma-separated; None stays None."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return value


def save_gif(result: dict, path: str | os.PathLike) -> str:
    """Write the GIF of an answer asked with ``return_gif=True``."""
    if not result.get("gif"):
        raise ValueError("this answer has no GIF: ask with return_gif=True")
    with open(path, "wb") as f:
        f.write(base64.b64decode(result["gif"].split(",", 1)[1]))
    return os.fspath(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m captioning.web.client", description="Caption images with a running server."
    )
    p.add_argument("images", nargs="+")
    p.add_argument("--url", default=DEFAULT_URL)
    p.add_argument("--model", default=None)
    p.add_argument("--num-beams", type=int, default=None)
    p.add_argument("--gif", default=None, help="write the attention GIF here (one image)")
    p.add_argument("--focus", default=None, metavar="X0,Y0,X1,Y1", help="describe this region (the image's pixels)")
    p.add_argument("--focus-strength", default=None, metavar="S", help="the focus prior's strength (default 10)")
    p.add_argument("--prefix", default=None, metavar="WORDS", help="the caption continues these words")
    args = p.parse_args(argv)
    status = 0
    for path in args.images:
        try:
            out = caption(
                path,
                url=args.url,
                model=args.model,
                num_beams=args.num_beams,
                return_gif=bool(args.gif),
                focus=args.focus,
                focus_strength=args.focus_strength,
                prefix=args.prefix,
            )
        except (APIError, OSError) as err:
            print(f"{path}: {err}", file=sys.stderr)
            status = 1
            continue
        print(f"{path}: {out['generated_text']}  ({out['score']:.3f})")
        if args.gif:
            save_gif(out, args.gif)
    return status


if __name__ == "__main__":
    sys.exit(main())
