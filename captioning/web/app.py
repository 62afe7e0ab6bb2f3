"""The web app: the page, ``POST /api/caption`` and friends, as one Starlette application.

Routes:

    GET  /                    the page (captioning/web/page.py)
    GET  /api/models          the served models: name, description, default settings
    POST /api/caption         multipart form: ``image`` (the file) and optional fields ``model``,
                              ``num_beams``, ``max_new_tokens``, ``length_penalty``,
                              ``attention_mode``, ``num_return_sequences``, ``return_gif``,
                              ``return_image`` -> JSON (see docs/WEB.md)
    GET  /examples/{i}        the i-th example image offered on the page
    GET  /healthz             {"status": "ok", "pending": n}

Every error is JSON ``{"error": "one line"}`` with a 4xx status for the client's mistakes (400 bad
field or unreadable image, 404 unknown model, 413 upload or image too large, 415 not an image or
not a multipart form) and 503 when too many requests are waiting.
"""
from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from captioning.web.service import Busy, InferenceQueue, Job, RequestError, ServedModel, Settings, truthy

MB = 1024 * 1024
CHUNK = 256 * 1024


class UploadTooLarge(RequestError):
    def __init__(self, limit: int):
        super().__init__(f"upload too large: the limit is {limit / MB:g} MB", 413)


class LimitBody:
    """ASGI middleware: refuse request bodies over ``max_bytes`` before the app reads them.

    A declared Content-Length over the limit is answered 413 at once (the body is read and thrown
    away, up to a bound, so that clients that send it all before reading the answer see the 413
    instead of a reset connection). A body without Content-Length (chunked) is counted as it is
    read, and the app's form parser gets :class:`UploadTooLarge` when it passes the limit.
    """

    def __init__(self, app, max_bytes: int, drain_bytes: int = 64 * MB, upload_limit: Optional[int] = None):
        self.app, self.max_bytes, self.drain_bytes = app, max_bytes, drain_bytes
        self.upload_limit = upload_limit or max_bytes  # the limit named in the message

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                return await _send_json(send, 400, {"error": "bad Content-Length header"})
            if length > self.max_bytes:
                drained = 0
                while drained <= self.drain_bytes:
                    message = await receive()
                    if message["type"] != "http.request":
                        return
                    drained += len(message.get("body", b""))
                    if not message.get("more_body"):
                        break
                return await _send_json(send, 413, {"error": UploadTooLarge(self.upload_limit).args[0]})
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise UploadTooLarge(self.upload_limit)
            return message

        return await self.app(scope, counted, send)


async def _send_json(send, status: int, payload: dict) -> None:
    import json

    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _safe_name(name: Optional[str]) -> str:
    """The client's file name, reduced to something harmless to echo in a message."""
    name = os.path.basename(name or "") or "upload"
    return re.sub(r"[^\w.\- ]", "_", name)[:80] or "upload"


def create_app(models: Sequence[ServedModel], max_upload_bytes: int = 10 * MB, max_batch: int = 8,
               max_pending: int = 64, workdir: Optional[str] = None):
    """The ASGI application serving ``models`` (the first is the default of the API)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, HTMLResponse, JSONResponse
    from starlette.routing import Route

    from captioning.web.page import PAGE

    if not models:
        raise ValueError("at least one model to serve")
    by_name = {m.name: m for m in models}
    if len(by_name) != len(models):
        raise ValueError(f"model names must differ: {[m.name for m in models]}")
    examples: list[Path] = []
    for model in models:
        examples += [p for p in model.examples if p not in examples]
    examples = examples[:8]
    owns_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="captioning-web-")
    state: dict = {}

    def error(message: str, status: int, **headers) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers or None)

    async def page(request: Request):
        return HTMLResponse(PAGE)

    async def health(request: Request):
        queue = state.get("queue")
        return JSONResponse({"status": "ok", "models": list(by_name), "pending": queue.pending() if queue else 0,
                             "batches": queue.batches if queue else 0,
                             "largest_batch": queue.largest_batch if queue else 0})

    async def list_models(request: Request):
        return JSONResponse({"models": [m.info() for m in models],
                             "examples": [{"url": f"/examples/{i}", "name": p.name} for i, p in enumerate(examples)],
                             "max_upload_bytes": max_upload_bytes})

    async def example(request: Request):
        i = request.path_params["index"]
        if not 0 <= i < len(examples):
            return error(f"no example {i}", 404)
        return FileResponse(examples[i])

    async def caption(request: Request):
        content_type = request.headers.get("content-type", "")
        if not content_type.startswith("multipart/form-data"):
            return error("send a multipart/form-data body with the image in the field 'image' "
                         "(curl -F image=@photo.jpg)", 415)
        upload_path = None
        try:
            try:
                form = await request.form(max_files=1, max_fields=20)
            except UploadTooLarge as err:
                return error(str(err), 413)
            except Exception as err:  # noqa: BLE001 - a malformed multipart body
                detail = getattr(err, "detail", None) or str(err) or type(err).__name__
                return error(f"could not read the form: {detail}", 400)
            try:
                upload = form.get("image")
                if upload is None or isinstance(upload, str):
                    return error("no image: send the image file as the multipart form field 'image'", 400)
                name = _safe_name(upload.filename)
                fd, upload_path = tempfile.mkstemp(suffix=".upload", dir=workdir)
                size = 0
                with os.fdopen(fd, "wb") as out:
                    while chunk := await upload.read(CHUNK):
                        size += len(chunk)
                        if size > max_upload_bytes:
                            return error(UploadTooLarge(max_upload_bytes).args[0], 413)
                        out.write(chunk)
                if size == 0:
                    return error(f"{name}: empty file (0 bytes)", 400)
                fields = {k: v for k, v in form.items() if isinstance(v, str)}
            finally:
                await form.close()
            model_name = fields.get("model") or models[0].name
            model = by_name.get(model_name)
            if model is None:
                return error(f"unknown model {model_name[:60]!r}; served: {', '.join(by_name)}", 404)
            settings = Settings.parse(fields, model.hard)
            job = Job(model, settings, upload_path, name, want_gif=truthy(fields.get("return_gif")),
                      want_image=truthy(fields.get("return_image")))
            future = state["queue"].submit(job)
            payload = await asyncio.wrap_future(future)
            return JSONResponse(payload)
        except Busy as err:
            return error(str(err), err.status, **{"Retry-After": "1"})
        except RequestError as err:
            return error(str(err), err.status)
        except Exception as err:  # noqa: BLE001 - a failure of the model: the server stays up
            return error(f"internal error: {type(err).__name__}: {' '.join(str(err).split())[:300]}", 500)
        finally:
            if upload_path is not None:
                try:
                    os.unlink(upload_path)
                except OSError:
                    pass

    async def not_found(request: Request, exc):
        status = getattr(exc, "status_code", 404)
        what = "method not allowed" if status == 405 else "not found"
        return error(f"{request.method} {request.url.path}: {what}", status)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        state["queue"] = InferenceQueue(max_batch=max_batch, max_pending=max_pending, workdir=workdir)
        try:
            yield
        finally:
            state["queue"].close()
            if owns_workdir:
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)

    routes = [
        Route("/", page),
        Route("/healthz", health),
        Route("/api/models", list_models),
        Route("/api/caption", caption, methods=["POST"]),
        Route("/examples/{index:int}", example),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    # room for the form's other fields and boundaries; the file itself is held to max_upload_bytes above
    return LimitBody(app, max_upload_bytes + 64 * 1024, upload_limit=max_upload_bytes)
