"""uvicorn's HTTP/1.1 protocol (h11) with the limits uvicorn does not have: a deadline for a
request's line and headers, a deadline for the client to take its answer, and a cap on open sockets.

uvicorn closes an idle kept-alive connection after ``timeout_keep_alive``, but a client that
connects and sends nothing, or half a header, holds its socket forever, and its
``limit_concurrency`` counts such idle sockets with the working ones. :func:`guarded_protocol`
makes a protocol class (uvicorn's ``http=`` setting takes one) that

* closes a connection whose request line and headers are not complete within ``header_timeout``
  seconds of its opening or of the previous answer on it (kept-alive connections included);
* resets a connection whose client has not taken its answer within ``send_timeout`` seconds of
  the answer outgrowing the server's write buffer (the transport's high-water mark), with
  ``SO_LINGER`` 0 and ``abort``: the buffered answer is dropped and its request's slot freed;
* closes at once a connection beyond ``max_sockets`` open ones.

Why each limit, and what Guard (requests, body deadline) and h11 (header sizes) add: docs/WEB.md,
"Strangers' files, slow clients and load".
"""

from __future__ import annotations

import socket
import struct

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from captioning.errors import ConfigError

#: SO_LINGER on, 0 s: close() resets the connection and drops the unsent bytes
RESET_ON_CLOSE = struct.pack("ii", 1, 0)
#: the uvicorn releases this subclass of its private H11Protocol was tested with (pyproject.toml's web extra)
TESTED_UVICORN = ("0.30.0", "0.54.0")
#: the methods of H11Protocol the subclass extends, each calling uvicorn's own
EXTENDED = (
    "connection_made",
    "connection_lost",
    "handle_events",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
)


def check_protocol(protocol: type = H11Protocol) -> None:
    """A one-line ConfigError where the installed uvicorn's ``H11Protocol`` lacks a method the guard extends
    (a release that reorganised its private protocol), naming the releases it was tested with."""
    missing = [name for name in EXTENDED if not callable(getattr(protocol, name, None))]
    if missing:
        from importlib.metadata import version

        low, high = TESTED_UVICORN
        raise ConfigError(
            f"captioning serve: uvicorn {version('uvicorn')}'s H11Protocol has no {missing[0]}() (a private part "
            f"web/protocol.py extends; tested with uvicorn {low} to {high}): pip install 'uvicorn>={low},<={high}'"
        )


def guarded_protocol(header_timeout: float, max_sockets: int, send_timeout: float = 60.0) -> type:
    """An :class:`H11Protocol` subclass with the headers' deadline, the answers' deadline and the socket cap
    (:func:`check_protocol` first)."""
    check_protocol()

    class GuardedH11Protocol(H11Protocol):
        _header_timer = None
        _send_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_sockets:
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            self._send_taken()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the request's headers are in: the body has its own deadline
                self._disarm()
                if not self._send_held():  # the previous answer was taken: a new one gets its own deadline
                    self._send_taken()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self._send_held():
                self._send_taken()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # the next request on a kept-alive connection

        def pause_writing(self) -> None:  # the transport's buffer is over its high-water mark
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(send_timeout, self._send_late)

        def resume_writing(self) -> None:
            super().resume_writing()
            if not self._send_held():
                self._send_taken()

        def _send_held(self) -> bool:
            """Whether bytes of an answer wait for the client: in the transport's buffer, or in the
            app's ``send`` (waiting for the buffer to drain)."""
            return bool(self.transport.get_write_buffer_size()) or self.flow is not None and self.flow.write_paused

        def _send_taken(self) -> None:
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _send_late(self) -> None:
            self._send_timer = None
            if self._send_held():  # (a connection closing after its answer waits for the client too)
                sock = self.transport.get_extra_info("socket")
                try:
                    if sock is not None:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
                except OSError:  # already gone
                    pass
                self.transport.abort()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol
