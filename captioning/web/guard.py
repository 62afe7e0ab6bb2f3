"""What one client may hold of the server: :class:`Limits`, and the ASGI middlewares that enforce
them around the app.

:class:`Guard` (outermost) checks the Host header (DNS rebinding), counts the requests being
handled and gives each request's body a deadline; :class:`LimitBody` refuses bodies over the
upload limit. The headers' deadline, the answers' deadline and the cap on open sockets are the
server's protocol's (captioning/web/protocol.py). A refusal is the JSON answer of its error type (captioning/web/errors.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
from collections.abc import Sequence
from dataclasses import dataclass

from captioning.web.errors import MB, BodyTimeout, Busy, RequestError, UploadTooLarge
from captioning.web.gifs import DEFAULT_GIF_PIXELS
from captioning.web.service import DEFAULT_MAX_RENDER

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Limits:
    """What one client may hold of the server, and for how long (seconds)."""

    header_timeout: float = 10.0  # to send a request's line and headers (the server's protocol enforces it)
    body_timeout: float = 60.0  # to send a request's body, from its headers (408 beyond)
    request_timeout: float = 60.0  # to wait for the model: queue, captioning, drawing (503 beyond)
    send_timeout: float = (
        60.0  # to take an answer that outgrew the server's write buffer (the connection is reset beyond)
    )
    stuck_after: float = 120.0  # /healthz answers 503 when the worker has been on one batch longer
    keep_alive: float = 5.0  # an idle kept-alive connection is closed after this
    max_active: int = 256  # requests being handled at once, idle connections not counted (503 beyond)
    max_sockets: int = 1024  # open connections at most; one more is closed at once
    max_render: int = DEFAULT_MAX_RENDER  # requests waiting for their GIF / image (503 beyond)
    max_gif_pixels: int = DEFAULT_GIF_PIXELS  # frames x width x height of one GIF (shrunk to fit)
    allowed_hosts: tuple[str, ...] = ()  # Host header names accepted besides the bound host and localhost

    def __post_init__(self):
        for name in ("header_timeout", "body_timeout", "request_timeout", "send_timeout", "stuck_after", "keep_alive"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")
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
        name = header[1 : header.find("]")] if "]" in header else header
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
            return await _send_error(
                send,
                RequestError(
                    f"Host header not allowed: {host[:80]!r} (the server's "
                    "--allowed-hosts names the hosts it answers to)"
                ),
            )
        if self.active >= self.limits.max_active and scope.get("path") != "/healthz":
            return await _send_error(
                send, Busy(f"too many requests being handled ({self.limits.max_active}); try again in a moment")
            )
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
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        **{name.lower(): value for name, value in err.headers.items()},
        "connection": "close",
    }
    await send(
        {
            "type": "http.response.start",
            "status": err.status,
            "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
        }
    )
    await send({"type": "http.response.body", "body": body})
