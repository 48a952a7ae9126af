"""A client that never finishes its request's headers loses its connection after
``TUNECACHE_SERVER_HEADER_SECONDS``; one whose headers came in time is never cut for it.

Against ``tunecache serve`` in a subprocess, at the socket: before the deadline, 500 connections
that each sent ``GET /health HTTP/1.1`` and a header were all still open 40 s later, and a server
short of file descriptors refused everyone else.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, start_server
from tunecache.http import IDENTITY_HEADER

SECONDS = 1.0


def _server(tmp_path: Path, setting: str, value: float) -> Iterator[LiveServer]:
    db_path = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log",
                        env={f"TUNECACHE_SERVER_{setting}": str(value)})  # fmt: skip
    yield live
    live.stop()


@pytest.fixture
def strict_server(tmp_path: Path) -> Iterator[LiveServer]:
    yield from _server(tmp_path, "HEADER_SECONDS", SECONDS)


def _connect(server: LiveServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.settimeout(0.2)
    return conn


def _open_after(conn: socket.socket, seconds: float, trickle: bytes = b"") -> bool:
    """Whether ``conn`` is still open ``seconds`` from now, sending ``trickle`` a byte every
    0.2 s meanwhile (what a slow-headers client does to stay within every per-read timeout)."""
    end = time.monotonic() + seconds
    pending = list(trickle)
    while time.monotonic() < end:
        try:
            if conn.recv(4096) == b"":
                return False
        except TimeoutError:
            pass
        except OSError:
            return False
        if pending:
            try:
                conn.sendall(bytes([pending.pop(0)]))
            except OSError:
                return False
    return True


def test_headers_that_never_finish_lose_the_connection(strict_server: LiveServer) -> None:
    silent, trickling = _connect(strict_server), _connect(strict_server)
    try:
        silent.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        trickling.sendall(b"GET /health HTTP/1.1\r\n")
        assert not _open_after(trickling, SECONDS * 3, b"X-Slow: " + b"a" * 100)
        assert not _open_after(silent, 0.5)
    finally:
        silent.close()
        trickling.close()


def test_a_kept_alive_connections_next_request_has_the_same_deadline(
    strict_server: LiveServer,
) -> None:
    conn = _connect(strict_server)
    try:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
        assert conn.recv(65536).startswith(b"HTTP/1.1 200")
        # uvicorn's keep-alive timer stops at the first byte of the next request
        conn.sendall(b"GET /health HTTP/1.1\r\n")
        assert not _open_after(conn, SECONDS * 3, b"X-Slow: " + b"a" * 100)
    finally:
        conn.close()


def test_a_request_whose_headers_came_in_time_is_not_cut(strict_server: LiveServer) -> None:
    """Its body may take longer than the header deadline (it has a deadline of its own), and
    the connection serves the next request after the answer."""
    conn = _connect(strict_server)
    body = b'{"key": "not a key"}'
    try:
        conn.sendall(b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n" % len(body))  # fmt: skip
        assert _open_after(conn, 0.2 * len(body) + 0.2, body[:-1])  # 4 s: past the deadline
        conn.sendall(body[-1:])
        time.sleep(0.5)
        assert conn.recv(65536).startswith(b"HTTP/1.1 422")
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
        assert conn.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        conn.close()


def test_a_pipelined_request_whose_headers_came_with_the_first_is_not_cut(
    strict_server: LiveServer,
) -> None:
    """Its headers came in time, with the first request's: the deadline, armed as the first was
    answered, took the running second request for a late one and closed its connection."""
    conn = _connect(strict_server)
    body = b'{"key": "not a key"}'
    try:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n" % len(body))  # fmt: skip
        assert _open_after(conn, 0.2 * len(body) + 0.2, body[:-1])  # its body: 4 s
        conn.sendall(body[-1:])
        time.sleep(0.5)
        assert conn.recv(65536).count(b"HTTP/1.1 ") >= 1  # the second answer (the first is read)
    finally:
        conn.close()


CAP = 4


@pytest.fixture
def capped_server(tmp_path: Path) -> Iterator[LiveServer]:
    yield from _server(tmp_path, "MAX_CONNECTIONS_PER_ADDRESS", CAP)


def _health(conn: socket.socket) -> bytes:
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.3)
    return conn.recv(65536)


def test_one_address_holds_at_most_its_cap_of_connections(capped_server: LiveServer) -> None:
    """One client could open connections until the server had no file descriptor left for
    anyone: past the cap, its next connection is answered 429 at once and closed, while its
    open ones, and every other address, are served."""
    host, port = capped_server.url.removeprefix("http://").split(":")
    for _ in range(CAP):  # WebSocket upgrades, answered and closed, leave nothing counted
        upgrade = _connect(capped_server)
        upgrade.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                        b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")  # fmt: skip
        time.sleep(0.2)
        assert upgrade.recv(65536).startswith(b"HTTP/1.1 "), "no answer to an upgrade"
        upgrade.close()
    time.sleep(0.2)
    held = [_connect(capped_server) for _ in range(CAP)]
    other = socket.create_connection((host, int(port)), timeout=10, source_address=("127.0.0.2", 0))
    other.settimeout(0.2)
    try:
        time.sleep(0.3)
        refused = httpx.get(f"{capped_server.url}/health", timeout=10)
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "1" and IDENTITY_HEADER in refused.headers
        assert refused.json() == {"status": 429, "errors": [], "detail": (
            f"more than {CAP} connections from this address are open to this server process: "
            "close some, or reuse them (one client, one connection pool)")}  # fmt: skip
        assert _health(held[0]).startswith(b"HTTP/1.1 200")  # an admitted one is served
        assert _health(other).startswith(b"HTTP/1.1 200")  # so is another address
        held.pop().close()
        time.sleep(0.3)
        assert httpx.get(f"{capped_server.url}/health", timeout=10).status_code == 200
    finally:
        for conn in (*held, other):
            conn.close()


def test_the_cap_counts_open_and_lingering_connections_per_address() -> None:
    from cache_server.address_cap import LINGERING, AddressCap

    cap = AddressCap(2)
    assert cap.admit("10.0.0.1") and cap.admit("10.0.0.1") and not cap.admit("10.0.0.1")
    assert cap.admit("10.0.0.2")  # another address has its own count
    cap.release("10.0.0.1")
    assert cap.admit("10.0.0.1") and not cap.admit("10.0.0.1")
    # A refused connection lingers for its answer to be read, a few at a time per address.
    assert [cap.linger("10.0.0.1") for _ in range(LINGERING + 1)] == [True] * LINGERING + [False]
    cap.release("10.0.0.1", refused=True)
    assert cap.linger("10.0.0.1") and not cap.admit("10.0.0.1")  # lingering is not admitted


def test_the_cap_counts_each_address_and_an_ipv4_mapped_one_as_its_ipv4() -> None:
    from cache_server.api.peers import client_of

    # Two hosts of one IPv6 network are two clients (a /64 would make a cluster one).
    assert client_of("2001:db8:1:2:aaaa::1") != client_of("2001:db8:1:2:bbbb::7")
    assert client_of("2001:DB8:1:2::1") == "2001:db8:1:2::1"
    assert client_of("::ffff:10.0.0.1") == client_of("10.0.0.1") == "10.0.0.1"
    assert client_of("fe80::1%eth0") == "fe80::1"
    assert client_of("not an address") == "not an address"


def test_a_full_process_refuses_many_connections_of_one_address_first() -> None:
    from cache_server.address_cap import AddressCap

    cap = AddressCap(256, total=100)  # its last 25 only for addresses holding fewer than 2
    assert sum(cap.admit("10.0.0.1") for _ in range(200)) == 75
    assert cap.full_for("10.0.0.1") and not cap.full_for("10.0.0.2")
    assert sum(cap.admit("10.0.0.2") for _ in range(200)) == 2  # a client or two still get in
    answer = cap.refusal(1, "10.0.0.1").decode()
    assert answer.startswith("HTTP/1.1 503 ") and "full (77 of its 100 connections held)" in answer
    assert "75 of them from this address" in answer
    while cap.admit(f"10.1.{len(cap._open)}.1"):  # every address, until full
        pass
    assert cap._held == 100 and not cap.linger("10.0.0.9")  # no descriptor even to answer with
    cap.release("10.0.0.1")
    assert not cap.admit("10.0.0.1") and cap.admit("10.0.0.3")


def test_addresses_of_one_client_cannot_take_every_connection(tmp_path: Path) -> None:
    """A local client took 256 connections from each of four loopback addresses, and the server
    (1,024 descriptors) answered no one else: a full process refuses the addresses holding
    many first, and one with none still gets in."""
    db_path = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_MAX_CONNECTIONS": "96",
                             "TUNECACHE_SERVER_MAX_CONNECTIONS_PER_ADDRESS": "32"})  # fmt: skip
    host, port = live.url.removeprefix("http://").split(":")
    held: list[socket.socket] = []
    try:
        for last in (2, 3, 4):
            for _ in range(32):
                conn = socket.create_connection((host, int(port)), timeout=10,
                                                source_address=(f"127.0.0.{last}", 0))  # fmt: skip
                held.append(conn)
        time.sleep(0.5)
        answers = [_peek(conn) for conn in held[-32:]]  # the third address's
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) == 32 - 8, answers[:3]  # 96 less 24 kept for small clients
        assert b"full (73 of its 96 connections held), 8 of them" in refused[0]  # one lingers
        honest = httpx.get(f"{live.url}/health", timeout=10)  # 127.0.0.1: holding none
        assert honest.status_code == 200, honest.text
    finally:
        for conn in held:
            conn.close()
        live.stop()


def _peek(conn: socket.socket) -> bytes:
    """What the server sent ``conn`` unasked (a refusal), or nothing."""
    conn.settimeout(0.05)
    try:
        return conn.recv(65536)
    except OSError:  # nothing sent: an admitted connection waiting for its request
        return b""


def test_a_server_raises_its_open_file_limit_to_the_hard_limit() -> None:
    import subprocess
    import sys

    code = ("import resource; from cache_server.address_cap import connections_limit; "
            "print(connections_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")  # fmt: skip

    def low() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          preexec_fn=low, timeout=60)  # fmt: skip
    assert done.stdout.split() == [str(4096 - 128), "4096"], done.stderr
