"""The web app: the page, ``POST /api/caption`` and friends, as one Starlette application.

Routes:

    GET  /                    the page (captioning/web/page.py)
    GET  /api/models          the served models: name, description, default settings
    POST /api/caption         multipart form: ``image`` (the file) and optional fields ``model``,
                              ``return_gif``, ``return_image`` and the decoding settings
                              (captioning/web/settings.py) -> JSON (see docs/WEB.md)
    GET  /examples/{i}        the i-th example image offered on the page
    GET  /healthz             {"status": "ok", "pending": n, ...}; 503 {"status": "stuck", ...} when
                              the worker has been on one batch longer than ``Limits.stuck_after``

Every error is JSON ``{"error": "one line"}`` with the status of its type
(captioning/web/errors.py): a 4xx for the client's mistakes (400 bad field, unreadable image or
Host header not allowed, 404 unknown model, 408 body not sent in time, 413 upload or image too
large, 415 not an image or not a multipart form), 500 with a generic message when the server fails
on a request (the detail is logged), and 503 (with Retry-After) when too many requests are waiting
or being handled, or the model does not answer in time.

:class:`Guard` (outermost) checks the Host header, counts the requests being handled and gives
each request's body a deadline; the headers' deadline and the cap on open sockets are the
server's (captioning/web/protocol.py).
"""
from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from captioning.web.errors import (
    MB,
    BodyTimeout,
    Busy,
    InternalError,
    MethodNotAllowed,
    NotFound,
    RequestError,
    UnsupportedMedia,
    UploadTooLarge,
)
from captioning.web.examples import EXAMPLES
from captioning.web.gifs import DEFAULT_GIF_PIXELS
from captioning.web.served import ServedModel
from captioning.web.service import DEFAULT_MAX_RENDER, InferenceQueue, Job, log
from captioning.web.settings import form_description, form_options, truthy

CHUNK = 256 * 1024
FORM_FIELDS = ("image", "model", "return_gif", "return_image")  # the form's fields besides the decoding settings
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Limits:
    """What one client may hold of the server, and for how long (seconds)."""

    header_timeout: float = 10.0  # to send a request's line and headers (the server's protocol enforces it)
    body_timeout: float = 60.0  # to send a request's body, from its headers (408 beyond)
    request_timeout: float = 60.0  # to wait for the model: queue, captioning, drawing (503 beyond)
    stuck_after: float = 120.0  # /healthz answers 503 when the worker has been on one batch longer
    keep_alive: float = 5.0  # an idle kept-alive connection is closed after this
    max_active: int = 256  # requests being handled at once, idle connections not counted (503 beyond)
    max_sockets: int = 1024  # open connections at most; one more is closed at once
    max_render: int = DEFAULT_MAX_RENDER  # requests waiting for their GIF / image (503 beyond)
    max_gif_pixels: int = DEFAULT_GIF_PIXELS  # frames x width x height of one GIF (shrunk to fit)
    allowed_hosts: tuple[str, ...] = ()  # Host header names accepted besides the bound host and localhost

    def __post_init__(self):
        for name in ("header_timeout", "body_timeout", "request_timeout", "stuck_after", "keep_alive"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("max_active", "max_sockets", "max_render", "max_gif_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


def allowed_host_names(bound: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The Host header names a server bound to ``bound`` accepts: the bound name, this machine's
    loopback names and ``extra`` (``*.example.org`` for a domain's names, ``*`` for any). Names
    that are IP addresses are always accepted (a rebinding attack needs a domain name); bound to
    every interface (0.0.0.0, ::), this machine's host names are accepted too."""
    names = [bound.strip("[]").lower(), *LOCAL_HOSTS, *(h.strip().lower() for h in extra if h.strip())]
    if bound.strip("[]") in ("0.0.0.0", "::", ""):  # every interface: this machine's own names too
        import socket

        names += [socket.gethostname().lower(), socket.getfqdn().lower()]
    return tuple(dict.fromkeys(names))


def host_allowed(header: str, allowed: Sequence[str]) -> bool:
    """Whether a Host header (``name``, ``name:port``, ``[v6]:port``) names an allowed host."""
    header = header.strip().lower()
    if header.startswith("["):
        name = header[1:header.find("]")] if "]" in header else header
    else:
        name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    if not name:
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    name = name.rstrip(".")
    return any(a == "*" or a == name or (a.startswith("*.") and name.endswith(a[1:])) for a in allowed)


class Guard:
    """ASGI middleware, outermost: the Host header check (DNS rebinding), the cap on requests being
    handled at once (``/healthz`` is never refused), and the deadline of each request's body.

    ``receive`` is wrapped: a body message that does not arrive before the deadline raises
    :class:`BodyTimeout` in the app (the caption route answers 408); when the app lets it escape
    before answering, the 408 is sent here. Either way the connection is closed.
    """

    def __init__(self, app, limits: Limits, allowed_hosts: Sequence[str]):
        self.app, self.limits, self.allowed_hosts = app, limits, tuple(allowed_hosts)
        self.active = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        if not host_allowed(host, self.allowed_hosts):
            return await _send_error(send, RequestError(f"Host header not allowed: {host[:80]!r} (the server's "
                                                        "--allowed-hosts names the hosts it answers to)"))
        if self.active >= self.limits.max_active and scope.get("path") != "/healthz":
            return await _send_error(send, Busy(f"too many requests being handled ({self.limits.max_active}); "
                                                "try again in a moment"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout
        body_done = False
        started = False

        async def timed_receive():
            nonlocal body_done
            if body_done:
                return await receive()
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), remaining)
            except asyncio.TimeoutError:
                raise BodyTimeout(self.limits.body_timeout) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def watched_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        self.active += 1
        try:
            await self.app(scope, timed_receive, watched_send)
        except BodyTimeout as err:
            if not started:
                await _send_error(send, err)
        finally:
            self.active -= 1


class LimitBody:
    """ASGI middleware: refuse request bodies over ``max_bytes`` before the app reads them.

    A declared Content-Length over the limit is answered 413 at once (the body is read and thrown
    away, up to a bound, so that clients that send it all before reading the answer see the 413
    instead of a reset connection). A body without Content-Length (chunked) is counted as it is
    read, and the app's form parser gets :class:`UploadTooLarge` when it passes the limit.
    """

    def __init__(self, app, max_bytes: int, drain_bytes: int = 64 * MB, upload_limit: int | None = None):
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
                return await _send_error(send, RequestError("bad Content-Length header"))
            if length > self.max_bytes:
                drained = 0
                try:
                    while drained <= self.drain_bytes:
                        message = await receive()
                        if message["type"] != "http.request":
                            return
                        drained += len(message.get("body", b""))
                        if not message.get("more_body"):
                            break
                except BodyTimeout:  # the deadline of Guard: answer now, the connection closes
                    pass
                return await _send_error(send, UploadTooLarge(self.upload_limit))
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


async def _send_error(send, err: RequestError) -> None:
    """An error's JSON answer sent from a middleware, with its status and headers; the connection
    is closed after it."""
    import json

    body = json.dumps({"error": str(err)}).encode()
    headers = {"content-type": "application/json", "content-length": str(len(body)),
               **{name.lower(): value for name, value in err.headers.items()}, "connection": "close"}
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(name.encode(), value.encode()) for name, value in headers.items()]})
    await send({"type": "http.response.body", "body": body})


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _safe_name(name: str | None) -> str:
    """The client's file name, reduced to something harmless to echo in a message."""
    name = os.path.basename(name or "") or "upload"
    return re.sub(r"[^\w.\- ]", "_", name)[:80] or "upload"


def create_app(models: Sequence[ServedModel], max_upload_bytes: int = 10 * MB, max_batch: int = 8,
               max_pending: int = 64, workdir: str | None = None, limits: Limits = Limits(),
               host: str = "127.0.0.1"):
    """The ASGI application serving ``models`` (the first is the default of the API), bound to
    ``host`` (for the Host header check: see :func:`allowed_host_names`)."""
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
    examples = examples[:EXAMPLES]
    owns_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="captioning-web-")
    state: dict = {}

    def error(err: RequestError) -> JSONResponse:
        return JSONResponse({"error": str(err)}, status_code=err.status, headers=dict(err.headers) or None)

    async def page(request: Request):
        return HTMLResponse(PAGE)

    async def health(request: Request):
        queue = state.get("queue")
        if queue is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        watch = queue.health(limits.stuck_after)
        payload = {"status": "stuck" if watch.pop("stuck") else "ok", "models": list(by_name),
                   "pending": queue.pending(), "rendering": queue.rendering(), "active": guard.active,
                   "batches": queue.batches, "largest_batch": queue.largest_batch, **watch}
        return JSONResponse(payload, status_code=503 if payload["status"] != "ok" else 200)

    async def list_models(request: Request):
        return JSONResponse({"models": [m.info() for m in models],
                             "examples": [{"url": f"/examples/{i}", "name": p.name} for i, p in enumerate(examples)],
                             "max_upload_bytes": max_upload_bytes, "max_gif_pixels": limits.max_gif_pixels,
                             "options": form_description()})

    async def example(request: Request):
        i = request.path_params["index"]
        if not 0 <= i < len(examples):
            return error(NotFound(f"no example {i}"))
        return FileResponse(examples[i])

    async def read_form(request: Request) -> tuple[str, str, dict[str, str]]:
        """(the upload's temporary file, the client's name for it, the other fields) of a caption request."""
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise UnsupportedMedia("send a multipart/form-data body with the image in the field 'image' "
                                   "(curl -F image=@photo.jpg)")
        try:
            form = await request.form(max_files=1, max_fields=len(FORM_FIELDS) + len(form_options()))
        except RequestError:  # the middlewares' BodyTimeout and UploadTooLarge, raised while the body is read
            raise
        except Exception as err:  # noqa: BLE001 - a malformed multipart body
            detail = getattr(err, "detail", None) or str(err) or type(err).__name__
            raise RequestError(f"could not read the form: {detail}") from None
        try:
            upload = form.get("image")
            if upload is None or isinstance(upload, str):
                raise RequestError("no image: send the image file as the multipart form field 'image'")
            name = _safe_name(upload.filename)
            fd, path = tempfile.mkstemp(suffix=".upload", dir=workdir)
            size = 0
            try:
                with os.fdopen(fd, "wb") as out:
                    while chunk := await upload.read(CHUNK):
                        size += len(chunk)
                        if size > max_upload_bytes:
                            raise UploadTooLarge(max_upload_bytes)
                        out.write(chunk)
                if size == 0:
                    raise RequestError(f"{name}: empty file (0 bytes)")
            except BaseException:
                _unlink(path)
                raise
            return path, name, {k: v for k, v in form.items() if isinstance(v, str)}
        finally:
            await form.close()

    async def caption(request: Request):
        upload = None
        try:
            upload, name, fields = await read_form(request)
            model_name = fields.get("model") or models[0].name
            model = by_name.get(model_name)
            if model is None:
                raise NotFound(f"unknown model {model_name[:60]!r}; served: {', '.join(by_name)}")
            job = Job(model, model.settings(fields), upload, name, want_gif=truthy(fields.get("return_gif")),
                      want_image=truthy(fields.get("return_image")))
            future = state["queue"].submit(job)
            try:
                payload = await asyncio.wait_for(asyncio.wrap_future(future), limits.request_timeout)
            except asyncio.TimeoutError:  # a waiting job is cancelled (the worker skips it); a running one is dropped
                future.cancel()
                raise Busy(f"the model did not answer within {limits.request_timeout:g} s; try again in a moment") from None
            return JSONResponse(payload)
        except RequestError as err:
            return error(err)
        except Exception as err:  # noqa: BLE001 - a failure of the server: logged, a generic answer
            log.error("%s %s failed", request.method, request.url.path, exc_info=err)
            return error(InternalError("the server failed on this request"))
        finally:
            if upload is not None:
                _unlink(upload)

    async def not_found(request: Request, exc):
        if getattr(exc, "status_code", 404) == 405:
            return error(MethodNotAllowed(f"{request.method} {request.url.path}: method not allowed"))
        return error(NotFound(f"{request.method} {request.url.path}: not found"))

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        state["queue"] = InferenceQueue(max_batch=max_batch, max_pending=max_pending, workdir=workdir,
                                        max_render=limits.max_render, max_gif_pixels=limits.max_gif_pixels)
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
    limited = LimitBody(app, max_upload_bytes + 64 * 1024, upload_limit=max_upload_bytes)
    guard = Guard(limited, limits, allowed_host_names(host, limits.allowed_hosts))
    return guard
