"""A request's headers must arrive within ``header_seconds`` of the connection being ready for
them, or the connection is closed.

uvicorn has no such deadline: its keep-alive timer stops at a connection's first byte, and no
timer runs until a response is done. A client that sends ``GET / HTTP/1.1`` and then nothing, or
a byte every few seconds, so held its connection (and a file descriptor) for as long as it liked,
and a few thousand such connections left the server none for anyone else. With this protocol
such a connection lasts ``header_seconds``. A request whose headers came in time is never cut: the
body has its own deadline (:mod:`cache_server.api.limits`), and the work none.

``tunecache serve`` runs uvicorn with ``http="cache_server.header_deadline:HeaderDeadline"``;
each server process reads the deadline from its settings (``TUNECACHE_SERVER_HEADER_SECONDS``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from cache_server.settings import ServerSettings

_Protocol: Any = AutoHTTPProtocol  # httptools' protocol where installed, else h11's


class HeaderDeadline(_Protocol):
    """uvicorn's HTTP protocol, closing a connection whose next request's headers are late."""

    seconds: float | None = None  # from the settings, on first use in this process
    _late: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._await_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._late is not None:
            self._late.cancel()
        super().connection_lost(exc)

    def _idle(self) -> bool:
        """No request of this connection is running: none yet, or the last one answered (a
        pipelined request whose headers came with an earlier one starts as that one ends)."""
        return self.cycle is None or bool(self.cycle.response_complete)

    def _await_headers(self) -> None:
        """Closes the connection unless a request's headers have come ``seconds`` from now
        (uvicorn starts a new ``cycle`` for each request whose headers it has parsed)."""
        if self._late is not None:
            self._late.cancel()
            self._late = None
        if self.transport.is_closing() or not self._idle():
            return
        waiting = self.cycle

        def late() -> None:
            if self.cycle is waiting and self._idle() and not self.transport.is_closing():
                self.transport.close()

        self._late = self.loop.call_later(_seconds(), late)


def _seconds() -> float:
    if HeaderDeadline.seconds is None:
        HeaderDeadline.seconds = ServerSettings().header_seconds
    return HeaderDeadline.seconds
