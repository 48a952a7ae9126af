"""A request's headers must arrive within ``header_seconds`` of the connection being ready for
them, or the connection is closed.

uvicorn has no such deadline: its keep-alive timer stops at a connection's first byte, and no
timer runs until a response is done. A client that sends ``GET / HTTP/1.1`` and then nothing, or
a byte every few seconds, so held its connection (and a file descriptor) for as long as it liked,
and a few thousand such connections left the server none for anyone else. With this protocol
such a connection lasts ``header_seconds``. A request whose headers came in time is never cut: the
body has its own deadline (:mod:`cache_server.api.limits`), and the work none.

The protocol also caps each client address's open connections (:mod:`cache_server.address_cap`),
and aborts a connection whose client has read nothing of what it was sent for ``drain_seconds``
(``TUNECACHE_SERVER_DRAIN_SECONDS``, 30: 64 KiB in that long is 2 KiB/s, slower than any client
that means to read): uvicorn's ``send`` waits for the transport's full buffer to drain for as
long as it takes, and its close too, so a request whose answer is never read kept its body, its
work and its connection for good (a client pipelining requests behind unread answers kept a
write token's 16 MiB bodies charged to the server's body budget, every other upload refused).
Aborting ends the request (uvicorn marks it disconnected and wakes the ``send``), and with it
what it held.

A request's head (its request line and headers) is bounded too: past :data:`HEAD_BYTES` without
its end it is answered 431 and the connection closed. uvicorn's httptools protocol bounds neither
(h11's does): one connection without a token sending one header or URL that never ends had the
server hold 130 MiB of it within the header deadline, its event loop at 100 % (the parser grows
the value by copying it whole at each read), and honest lookups timed out. And a request that is
not HTTP is answered 400 in the API's error shape (uvicorn's own answer was plain text, without
the header that says it comes from tunecache).

``tunecache serve`` runs uvicorn with ``http="cache_server.header_deadline:HeaderDeadline"``;
each server process reads the deadline and the cap from its settings
(``TUNECACHE_SERVER_HEADER_SECONDS``, ``TUNECACHE_SERVER_MAX_CONNECTIONS_PER_ADDRESS``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from cache_server.address_cap import AddressCap
from cache_server.api.peers import client_of
from cache_server.api.problems import raw_answer
from cache_server.settings import ServerSettings

_Protocol: Any = AutoHTTPProtocol  # httptools' protocol where installed, else h11's

# The most bytes of a request's head (request line and headers) a connection may send: a head
# still arriving is counted by the reads after the one it began in (a read's more at most pass
# before it is found), one that ended by what the parser found in it. A lookup's head is under
# 1 KiB; nginx's limit is 4 x 8 KiB by default.
HEAD_BYTES: Final = 64 * 2**10
# Whether the protocol says where a request's head begins and ends (httptools' does; h11's does
# not, and bounds a head itself: uvicorn's h11_max_incomplete_event_size)
_HEADS_SEEN: Final = hasattr(_Protocol, "on_headers_complete")


class HeaderDeadline(_Protocol):
    """uvicorn's HTTP protocol, closing a connection whose next request's headers are late."""

    seconds: float | None = None  # from the settings, on first use in this process
    drain: float | None = None  # likewise
    cap: AddressCap | None = None  # likewise
    retry_after = 1
    _late: asyncio.TimerHandle | None = None
    _address: str | None = None  # counted (as open, or as refused and lingering) until lost
    _refused = False
    _stalled: asyncio.TimerHandle | None = None  # while the transport's buffer is full
    _heading = True  # a request's head may be arriving (none has begun, or its headers not done)
    _began = False  # a request began in the data being read
    _head_bytes = 0  # of the head arriving (or trailers), read since the read it began in
    _headed = False  # a head ended in the data being read
    _bodied = False  # body bytes came in the data being read
    _in_message = False  # a request began and has not ended (its head, body or trailers due)
    _answered = False  # by this protocol, and closed
    _parsed = 0  # bytes of the head arriving that the parser handed over (its URL, its headers)
    _oversize = False  # a head past HEAD_BYTES ended: never served, answered 431
    _held: bytes | None = None  # a 431 written once the requests before it are answered
    _held_own: Any = None  # the request a held 431 refuses the trailers of (not waited for)

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._cycles: list[Any] = []  # this connection's requests not answered yet
        peer = transport.get_extra_info("peername")
        address = client_of(peer[0]) if isinstance(peer, tuple) and peer else None
        self._address = address
        if address is not None and not _cap().admit(address):
            self._refuse(transport, address)
            return
        self._await_headers()

    def _refuse(self, transport: asyncio.Transport, address: str) -> None:
        """Answers 429 (503 where the process is full) and closes (:meth:`_close_after`); at
        once when the address already has a few such connections lingering, or no descriptor is
        left to linger with."""
        self._refused = True
        if not _cap().linger(address):
            self._address = None  # nothing counted
            transport.write(_cap().refusal(HeaderDeadline.retry_after, address))
            transport.close()
            return
        self._close_after(transport, _cap().refusal(HeaderDeadline.retry_after, address))

    def data_received(self, data: bytes) -> None:
        if self._refused or self._answered or self._held is not None:
            return
        self._began = self._headed = self._bodied = False
        super().data_received(data)
        if not _HEADS_SEEN or self._answered or self.transport.is_closing():
            return  # answered in this read (a request that is not HTTP): nothing more
        if self._oversize:
            self._refuse_head(_too_large("line and headers"))
            return
        if self._heading:  # a head arriving: counted from the read after the one it began in
            counted = not self._began
        else:  # a message past its head: a read without body bytes holds framing or trailers
            counted = self._in_message and not (self._headed or self._bodied)
        self._head_bytes = self._head_bytes + len(data) if counted else 0
        if self._head_bytes > HEAD_BYTES:
            own = None if self._heading else self.cycle  # trailers: their request is refused
            self._refuse_head(_too_large("line and headers, or its trailers"), own)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._heading = self._began = self._in_message = True
        self._parsed = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._parsed += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._parsed += len(name) + len(value) + 4  # ": " and CRLF

    def on_headers_complete(self) -> None:
        self._heading, self._headed = False, True
        # A head that ended in the read it began in was never counted by the reads (up to a
        # read's 256 KiB of it went through): counted here, from what the parser handed over
        # (not the spaces it drops before a value: those pass within the one read), and such a
        # request is never served (no cycle: uvicorn would run it meanwhile), nor one after it.
        if self._oversize or self._parsed > HEAD_BYTES:
            self._oversize = True
            return
        super().on_headers_complete()
        if self.cycle is not None:  # pipelined requests each have one, the newest uvicorn's
            self._cycles = [c for c in self._cycles if not c.response_complete] + [self.cycle]

    def on_body(self, body: bytes) -> None:
        self._bodied = True
        if not self._oversize:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        if not self._oversize:
            super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """A request that is not HTTP (uvicorn answered it in plain text), in the API's shape."""
        detail = f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})"
        self._answer(raw_answer(400, "Bad Request", detail))

    def _refuse_head(self, answer: bytes, own: Any = None) -> None:
        """Answers a head past the limit (431) and closes, once the requests before it on this
        connection (not ``own``, the request whose trailers these are) are answered: answered
        at once, a pipelined request before it lost its answer (499), its work undone or done
        unsaid. Nothing more is read meanwhile."""
        if self._waiting(own):
            self._held, self._held_own = answer, own
            self.transport.pause_reading()
            return
        self._answer(answer)

    def _waiting(self, own: Any) -> bool:
        """Whether a request of this connection but ``own`` awaits its answer's end."""
        return any(not c.response_complete and c is not own for c in self._cycles)

    def _answer(self, answer: bytes) -> None:
        """Writes ``answer`` and closes the connection (:meth:`_close_after`)."""
        self._answered = True
        self._gone()  # a request still being served writes nothing after the answer's end
        self._close_after(self.transport, answer)

    def _close_after(self, transport: asyncio.Transport, answer: bytes) -> None:
        """Writes ``answer`` and closes: the write side at once, the connection a second later,
        what the client sends meanwhile read and dropped (closed with it unread, the connection
        was reset, and the client could lose the answer)."""
        transport.write(answer)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        if self._late is not None:
            self._late.cancel()
        self._late = self.loop.call_later(1.0, transport.close)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._held is not None:
            if not self._waiting(self._held_own):
                self._answer(self._held)
            return
        self._await_headers()

    def pause_writing(self) -> None:
        """The buffer is full: the client has ``drain_seconds`` to read, or is cut off."""
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(_drain(), self._cut_off)

    def _cut_off(self) -> None:
        """Aborts the connection, its requests marked gone first (:meth:`_gone`): the transport
        may wake the waiting ``send`` before it says the connection is lost, and that ``send``
        then wrote to a closed transport (a traceback in the log)."""
        self._stalled = None
        self._gone()
        self.transport.abort()

    def _gone(self) -> None:
        """Marks every request of this connection not answered yet gone, and wakes it: uvicorn
        marks only its newest (``cycle``), and behind pipelined requests the one sending is an
        older one, whose ``send`` then wrote to the closed transport (uvloop raised: an internal
        error and a traceback logged for each connection a client closed unread)."""
        for cycle in self._cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()
        if self._stalled is not None:
            self._stalled.cancel()
        if self._late is not None:
            self._late.cancel()
        if self._address is not None:
            _cap().release(self._address, refused=self._refused)
            self._address = None
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


def _cap() -> AddressCap:
    if HeaderDeadline.cap is None:
        settings = ServerSettings()
        HeaderDeadline.cap = AddressCap(settings.max_connections_per_address,
                                        settings.max_connections)  # fmt: skip
        HeaderDeadline.retry_after = settings.retry_after
    return HeaderDeadline.cap


def _drain() -> float:
    if HeaderDeadline.drain is None:
        HeaderDeadline.drain = ServerSettings().drain_seconds
    return HeaderDeadline.drain


def _seconds() -> float:
    if HeaderDeadline.seconds is None:
        HeaderDeadline.seconds = ServerSettings().header_seconds
    return HeaderDeadline.seconds


def _too_large(what: str) -> bytes:
    detail = f"the request's head (its {what}) is over {HEAD_BYTES} bytes, the server's limit"
    return raw_answer(431, "Request Header Fields Too Large", detail)
