"""uvicorn's HTTP/1.1 protocol (h11) with the limits uvicorn does not have: a deadline for a
request's line and headers, and a cap on open sockets.

uvicorn closes an idle kept-alive connection after ``timeout_keep_alive``, but a client that
connects and sends nothing, or half a header, holds its socket forever, and its
``limit_concurrency`` counts such idle sockets with the working ones. :func:`guarded_protocol`
makes a protocol class (uvicorn's ``http=`` setting takes one) that

* closes a connection whose request line and headers are not complete within ``header_timeout``
  seconds of its opening or of the previous answer on it (kept-alive connections included);
* closes at once a connection beyond ``max_sockets`` open ones.

Requests being handled are counted by :class:`captioning.web.guard.Guard` (503 beyond), the body's
deadline is Guard's too; header sizes are h11's limit (``h11_max_incomplete_event_size``).
"""
from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def guarded_protocol(header_timeout: float, max_sockets: int) -> type:
    """An :class:`H11Protocol` subclass with the headers' deadline and the socket cap."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_sockets:
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the request's headers are in: the body has its own deadline
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # the next request on a kept-alive connection

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
