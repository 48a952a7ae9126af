"""Hostile HTTP servers on loopback, at the socket: the client's transport is the boundary under
test, so these speak raw HTTP/1.1 (slowly, partly, or not at all) where a real server would not.

Each behaviour is a function of the connection and the request read from it; :func:`serve`
runs one on a loopback port and yields its URL.

Example:
    >>> with serve(trickle_body) as url:  # doctest: +SKIP
    ...     Client(url, timeout=1.0).lookup(key)
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tunecache import __version__
from tunecache.http import IDENTITY_HEADER

DRIP = 0.05  # seconds between two trickled bytes
IDENTITY = f"{IDENTITY_HEADER}: tunecache/{__version__}\r\n"


@dataclass
class Request:
    method: str
    path: str
    body: bytes


@dataclass
class Seen:
    """What a hostile server saw: the requests it read, by ``METHOD path``."""

    requests: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


Behaviour = Callable[[socket.socket, Request, Seen], None]


def read_request(conn: socket.socket) -> Request | None:
    """One request off ``conn`` (``None``: the client closed it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                   if line.lower().startswith("content-length:")), 0)  # fmt: skip
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return Request(method, path, body)


def answer(conn: socket.socket, status: int, body: bytes, *, identity: bool = True,
           content_type: str = "application/json") -> None:  # fmt: skip
    """A whole answer at once."""
    head = (f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{IDENTITY if identity else ''}\r\n")  # fmt: skip
    conn.sendall(head.encode() + body)


def drip(conn: socket.socket, data: bytes, seen: Seen) -> None:
    """``data`` one byte every :data:`DRIP` seconds, until the client goes or the test ends."""
    for byte in data:
        if seen.stop.wait(DRIP):
            return
        try:
            conn.sendall(bytes([byte]))
        except OSError:
            return


def trickle_body(conn: socket.socket, request: Request, seen: Seen) -> None:
    """Headers at once, then a 1 MB body one byte at a time."""
    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000"
                 f"\r\n{IDENTITY}\r\n".encode())  # fmt: skip
    drip(conn, b"{" + b" " * 999_999, seen)


def trickle_headers(conn: socket.socket, request: Request, seen: Seen) -> None:
    """A status line, then one endless header one byte at a time."""
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    drip(conn, b"X-Padding: " + b"a" * 100_000, seen)


def silent(conn: socket.socket, request: Request, seen: Seen) -> None:
    """Reads the request and never answers."""
    seen.stop.wait(120)


def not_tunecache(conn: socket.socket, request: Request, seen: Seen) -> None:
    """Another web server: every path is an HTML 404 page."""
    page = b"<html><head><title>404 Not Found</title></head>\n<body>\n<h1>Not Found</h1>\n</body>"
    answer(conn, 404, page, identity=False, content_type="text/html")


def slow_writes(conn: socket.socket, request: Request, seen: Seen) -> None:
    """A tunecache server that misses every lookup and refuses miss reports at once, and
    never answers anything else (an upload)."""
    if request.path == "/v1/lookup":
        answer(conn, 404, b'{"status": 404, "detail": "miss", "errors": []}')
    elif request.path == "/v1/misses":
        answer(conn, 429, b'{"status": 429, "detail": "too many", "errors": []}')
    else:
        silent(conn, request, seen)


def lookups_miss(conn: socket.socket, request: Request, seen: Seen) -> None:
    """Every request is a tunecache miss (what a proxy in front of a server passes on)."""
    answer(conn, 404, b'{"status": 404, "detail": "miss", "errors": []}')


def serve(behaviour: Behaviour) -> contextlib.AbstractContextManager[tuple[str, Seen]]:
    """Runs ``behaviour`` for every request on a loopback port; yields ``(url, seen)``."""
    return _serve(behaviour)


@contextlib.contextmanager
def serve_slow_reader() -> Iterator[tuple[str, Seen]]:
    """A server that reads a request's head, then its body a kilobyte every 0.1 s, with a small
    receive buffer: an upload to it cannot finish quickly."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    seen = Seen()

    def handle(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data and (chunk := conn.recv(1024)):
                data += chunk
            seen.requests.append(data.split(b"\r\n", 1)[0].decode("latin-1"))
            while not seen.stop.wait(0.1):
                try:
                    if not conn.recv(1024):
                        return
                except OSError:
                    return

    yield from _listening(listener, seen, handle)


@contextlib.contextmanager
def _serve(behaviour: Behaviour) -> Iterator[tuple[str, Seen]]:
    listener = socket.create_server(("127.0.0.1", 0))
    seen = Seen()

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                while not seen.stop.is_set() and (request := read_request(conn)) is not None:
                    seen.requests.append(f"{request.method} {request.path}")
                    behaviour(conn, request, seen)
            except OSError:
                pass

    yield from _listening(listener, seen, handle)


def _listening(listener: socket.socket, seen: Seen,
               handle: Callable[[socket.socket], None]) -> Iterator[tuple[str, Seen]]:  # fmt: skip
    """Accepts connections on ``listener`` for ``handle`` until the test is done."""

    def accept() -> None:
        while not seen.stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        seen.stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        listener.close()
