"""Loading the checkpoints to serve and running the web server (uvicorn)."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Sequence

from captioning.errors import ConfigError
from captioning.plugins import load_plugins
from captioning.web.examples import expand_examples
from captioning.web.served import ServedModel
from captioning.web.settings import Settings

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 7860
# the most pixels of an upload, decoded (3 bytes each as RGB); docs/WEB.md gives the peak memory of a decode
DEFAULT_MAX_PIXELS = 24_000_000
HEADER_BYTES = 16 * 1024  # a request's line and headers at most (h11's limit; 400 beyond)


def split_spec(spec: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); a plain path (or one that exists as given) -> (None, PATH)."""
    match = re.fullmatch(r"([\w.\-]+)=(.+)", spec)
    if match and not os.path.exists(spec):
        return match.group(1), match.group(2)
    return None, spec


def _name_models(models: list[ServedModel], labels: list[str | None]) -> None:
    """Unnamed models are called by their attention kind ("soft", "hard"), then kind-encoder, then -2, -3..."""
    given = {label for label in labels if label}
    taken: set[str] = set(given)
    kinds = [f"{m.description.get('attention') or 'model'}" for m in models]
    full = [f"{k}-{m.description.get('encoder') or 'model'}" for k, m in zip(kinds, models)]
    for model, label, kind, long in zip(models, labels, kinds, full):
        if label:
            model.name = label
            continue
        name = kind if kinds.count(kind) == 1 and kind not in given else long
        base, n = name, 2
        while name in taken:
            name, n = f"{base}-{n}", n + 1
        taken.add(name)
        model.name = name


def load_models(
    checkpoints: Sequence[str], device: str = "cpu", examples: Sequence[str] = (), layer=None
) -> list[ServedModel]:
    """The models of ``NAME=PATH`` / ``PATH`` specs, named, warmed up (one caption each); ``layer``:
    ``--layer``, the transformers' maps shown (a one-line error when no model is a transformer)."""
    from PIL import Image

    from captioning.models.transformer import choose_attention_layer, transformer_members

    load_plugins()  # (python -m captioning.web does not go through the command line's main)
    if not checkpoints:
        raise ConfigError("no checkpoint to serve: pass --checkpoint PATH (several for a comparison)")
    example_paths = expand_examples(examples)
    models, labels = [], []
    for spec in checkpoints:
        label, path = split_spec(spec)
        models.append(ServedModel.load(label, path, device=device, examples=example_paths, layer=layer))
        labels.append(label)
    if layer is not None and not any(transformer_members(m.captioner.model) for m in models):
        choose_attention_layer(models[0].captioner.model, layer)  # its one-line error: not a transformer
    _name_models(models, labels)
    blank = Image.new("RGB", (64, 64), (127, 127, 127))
    for model in models:  # the first beam search allocates what later ones reuse; it also tells the grid
        model.caption([blank], Settings())
    return models


def uvicorn_config(app, host: str, port: int, limits, log_level: str = "info"):
    """The ``uvicorn.Config`` of the server: its h11 protocol with the headers' and the answers'
    deadlines and the socket cap (captioning/web/protocol.py), headers of at most :data:`HEADER_BYTES`, idle
    connections closed after ``limits.keep_alive`` s; uvicorn's own ``limit_concurrency`` is left
    off (it counts idle sockets): :class:`captioning.web.guard.Guard` counts the requests handled."""
    import uvicorn

    from captioning.web.protocol import guarded_protocol

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        http=guarded_protocol(limits.header_timeout, limits.max_sockets, limits.send_timeout),
        timeout_keep_alive=limits.keep_alive,
        h11_max_incomplete_event_size=HEADER_BYTES,
    )


def serve_command(checkpoint, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    """The command line that serves ``checkpoint`` (for the demo to print at its end)."""
    command = f"captioning serve --checkpoint {checkpoint}"
    if host != DEFAULT_HOST:
        command += f" --host {host}"
    if port != DEFAULT_PORT:
        command += f" --port {port}"
    return command


def serve(
    checkpoints: Sequence[str],
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    device: str = "cpu",
    examples: Sequence[str] = (),
    max_upload_mb: float = 10.0,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_batch: int = 8,
    max_pending: int = 64,
    max_connections: int = 256,
    threads: int | None = None,
    log_level: str = "info",
    limits=None,
    layer=None,
    lang: str | None = None,
) -> int:
    """Load the checkpoints and serve the page and the API until interrupted.

    ``limits`` (:class:`captioning.web.guard.Limits`) holds the deadlines and the other caps; its
    ``max_active`` is ``max_connections`` (requests being handled at once, 503 beyond). ``lang``: the
    page's language (None: each browser's own, from its Accept-Language header)."""
    try:
        import python_multipart  # noqa: F401  (python-multipart: Starlette's form parser, by its own name)
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as err:
        raise ConfigError(
            f"the web demo needs its extra: pip install -e '.[web]' ({err.name or err} is missing)"
        ) from None
    import torch
    from PIL import Image

    from captioning.web.app import create_app
    from captioning.web.errors import MB
    from captioning.web.guard import Limits

    if max_pixels < 1 or max_upload_mb <= 0:
        raise ConfigError("--max-pixels and --max-upload-mb must be positive")
    Image.MAX_IMAGE_PIXELS = int(max_pixels)  # load_image refuses anything larger (decompression bombs)
    if threads:
        torch.set_num_threads(threads)
    limits = dataclasses.replace(limits or Limits(), max_active=max_connections)
    models = load_models(checkpoints, device=device, examples=examples, layer=layer)
    app = create_app(
        models,
        max_upload_bytes=int(max_upload_mb * MB),
        max_batch=max_batch,
        max_pending=max_pending,
        limits=limits,
        host=host,
        lang=lang,
    )
    shown = f"[{host}]" if ":" in host else host
    print(
        f"serving {', '.join(m.name for m in models)} on http://{shown}:{port}  "
        f"(the page at /, the API at POST /api/caption; Ctrl+C stops)",
        flush=True,
    )
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: --host {host} makes the page and the API reachable by anyone who can reach this machine "
            "on that address (no login, no TLS): they can send images and read the model's description",
            file=sys.stderr,
            flush=True,
        )
    uvicorn.Server(uvicorn_config(app, host, port, limits, log_level)).run()
    return 0
