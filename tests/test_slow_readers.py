"""A client that does not read its answers holds no slot of the server's.

Against ``tunecache serve`` in a subprocess, at the socket: two connections with a tiny receive
buffer, each sending several pipelined ``GET /ui/swagger/swagger-ui-bundle.js`` (1.5 MB) and
never reading, held both of the API's slots of the process (a slot was held until uvicorn's
``send`` returned, which waits for the socket to drain) and every lookup and upload got 503 for
as long as they stayed open. A slot is given back when the answer is made, static files have
slots of their own, and one ``send`` waits at most :data:`~cache_server.api.shedding.SEND_SECONDS`
for the client to read (tests/test_shedding.py, at the middleware).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import swagger_ui_bundle

from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, make_key, make_record

BUNDLE = "/ui/swagger/swagger-ui-bundle.js"
BUNDLE_BYTES = (Path(swagger_ui_bundle.swagger_ui_path) / "swagger-ui-bundle.js").read_bytes()
TINY_BUFFER = 4096  # SO_RCVBUF: the kernel takes a little more, far less than one answer


@pytest.fixture
def shedding_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server that sheds as a deployed one does (conftest's servers wait 30 s for a slot):
    a lookup that finds the API's slots held gets 503 at once."""
    db_path = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_MAX_WAIT": "0.02"})  # fmt: skip
    yield live
    live.stop()


def _reader(server: LiveServer, buffer: int = TINY_BUFFER) -> socket.socket:
    """A connection whose receive buffer is ``buffer`` bytes (set before connecting, so the
    window the server sees is small from the start)."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    conn.settimeout(10)
    conn.connect((host, int(port)))
    return conn


def _lookup(server: LiveServer) -> int:
    answer = httpx.post(f"{server.url}/v1/lookup", json={"key": make_key().to_json()}, timeout=10)
    return answer.status_code


def _open(conn: socket.socket) -> bool:
    """Whether the server still holds ``conn`` open (its unread answer waiting in the buffer)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


@pytest.mark.parametrize(
    ("path", "pipelined"),
    [(BUNDLE, 8), ("/openapi.json", 60)],  # 60 answers of 95 KB: more than the sockets take
    ids=["static-file", "api-answer"],
)
def test_clients_that_never_read_hold_no_slot_lookups_need(
    shedding_server: LiveServer, path: str, pipelined: int
) -> None:
    """A static file is streamed (a slot of its own, held while it streams); an API answer is
    made in one piece, and its start waits behind the unread answer before it with no slot."""
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    hostile = [_reader(shedding_server) for _ in range(2)]
    try:
        for conn in hostile:
            conn.sendall(request * pipelined)  # none of the answers is ever read
        time.sleep(1.0)  # the server writes what the sockets take, then waits for them
        statuses = []
        for _ in range(12):  # over 3 s: the slots were held for as long as the sockets were
            statuses.append(_lookup(shedding_server))
            time.sleep(0.25)
        assert all(_open(conn) for conn in hostile)  # the attack still stood
        assert 503 not in statuses, statuses
        assert set(statuses) == {404}, statuses  # a miss: looked up, not refused
    finally:
        for conn in hostile:
            conn.close()


def test_a_client_that_reads_slowly_gets_its_whole_answer(shedding_server: LiveServer) -> None:
    """The same tiny buffer, read a little at a time: every byte of two pipelined answers."""
    conn = _reader(shedding_server)
    try:
        conn.sendall(f"GET {BUNDLE} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * 2)
        received = bytearray()
        end = time.monotonic() + 60
        while received.count(BUNDLE_BYTES) < 2 and time.monotonic() < end:
            chunk = conn.recv(TINY_BUFFER)
            assert chunk, "the server closed the connection"
            received += chunk
        assert received.count(b"HTTP/1.1 200") == 2 and received.count(BUNDLE_BYTES) == 2
    finally:
        conn.close()
    answer = httpx.get(f"{shedding_server.url}{BUNDLE}", timeout=30)
    assert answer.status_code == 200 and answer.content == BUNDLE_BYTES
    assert _lookup(shedding_server) == 404  # a miss: looked up


def test_a_client_that_reads_nothing_is_cut_off_at_the_drain_deadline(tmp_path: Path) -> None:
    """uvicorn waits for a full buffer to drain for as long as it takes (its close too): a
    request whose answer was never read kept its body, its work and its connection for good.
    The server aborts a connection that has read nothing for ``drain_seconds`` (2 here); one
    that reads slowly is never cut (test_a_client_that_reads_slowly_gets_its_whole_answer)."""
    db_path = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_DRAIN_SECONDS": "2"})  # fmt: skip
    try:
        conn = _reader(live)
        conn.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 60)
        time.sleep(12)  # the 2 s deadline, with room for a busy machine
        conn.settimeout(10)
        got = b""
        while more := conn.recv(65536):  # what was sent before the cut, then its end
            got += more
        answers = got.count(b"HTTP/1.1 200")
        assert 0 < answers < 60, answers  # cut off: not every answer came
        assert httpx.get(f"{live.url}/health", timeout=10).status_code == 200
    finally:
        conn.close()
        live.stop()


def test_clients_gone_mid_answer_log_no_internal_error(shedding_server: LiveServer) -> None:
    """Five connections pipeline listings of 200 records they never read, then close: no
    "internal error" (the server logged a 500 as its own bug, with a traceback, and uvicorn one
    more, for each connection); the server answers on."""
    assert shedding_server.db_path is not None
    log = shedding_server.db_path.parent / "server.log"
    with httpx.Client(headers=AUTH, timeout=30) as client:
        for i in range(200):
            upload = make_record(make_key(m=64 + i)).model_dump(mode="json", by_alias=True)
            assert client.post(f"{shedding_server.url}/v1/records", json=upload).status_code == 201
    before = log.read_text(errors="replace")
    hostile = [_reader(shedding_server) for _ in range(5)]
    for conn in hostile:
        conn.sendall(b"GET /v1/records?limit=500 HTTP/1.1\r\nHost: x\r\n\r\n" * 20)
    time.sleep(2.0)  # the server writes what the sockets take, then waits for them
    for conn in hostile:
        conn.close()
    time.sleep(2.0)  # each waiting send finds its transport gone
    added = log.read_text(errors="replace")[len(before) :]
    assert "internal error" not in added, added[-3000:]
    assert "Traceback" not in added and "ERROR" not in added, added[-3000:]
    assert httpx.get(f"{shedding_server.url}/health", timeout=10).status_code == 200
