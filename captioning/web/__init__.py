"""A web page and an HTTP API to try captioning models (``pip install -e '.[web]'``).

    captioning serve --checkpoint CKPT [--checkpoint NAME=CKPT2 ...] [--host 127.0.0.1] [--port 7860]
    python -m captioning.web --checkpoint CKPT          # the same command, without the `captioning` entry point

The page (``/``): upload, paste or pick an example image; the caption with its score and the top
beams; the decoding settings (every GenerationConfig option marked for the web); the attention
GIF and a per-word view of the maps; each model's description. The API: ``POST /api/caption``
(multipart field ``image``) -> JSON; see docs/WEB.md and :mod:`captioning.web.client` for a
Python client.

Modules: ``app`` (the Starlette application and its routes); ``guard`` (:class:`~captioning.web.guard.Limits`
and the middlewares: Host header, requests handled, body deadline, upload limit); ``errors`` (one
error type per HTTP status); ``settings`` (a request's decoding settings, from GenerationConfig's
options); ``served`` (a model behind the page: description, settings check, JSON). Then ``service``
(the bounded batching queue; no HTTP); ``images`` (reading an upload, data URIs); ``gifs`` (the GIF
pixel budget); ``examples`` (example images, the run's config); ``protocol`` (uvicorn's h11 protocol
with a headers deadline and a socket cap). Last, ``page`` (the HTML), ``server`` (loading and
uvicorn) and ``client`` (a standard-library client). The ``serve`` command's flags and run are
cli/serve.py's.
"""

from captioning.web.server import serve, serve_command

__all__ = ["serve", "serve_command"]
