"""A request's head (its line and headers) is bounded, and a request that is not HTTP is
answered in the API's error shape.

An audit without a token sent ``GET /health`` and a header (or a URL) that never ended: the
server held 130 MiB of it within the header deadline, its event loop at 100 % (uvicorn's
httptools protocol grows the value by copying it whole at each read), and honest lookups timed
out; a 32 MiB header that did end was answered 200. Unparsable requests got uvicorn's plain-text
400, without the header that says the answer is tunecache's. Against ``tunecache serve`` in a
subprocess, at the socket.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from cache_server.header_deadline import HEAD_BYTES
from tests.conftest import LiveServer, start_server
from tests.factories import issue_token, make_key
from tunecache.http import IDENTITY_HEADER

KiB = 2**10


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("heads")
    live = start_server(f"sqlite:///{folder / 'c.db'}", folder / "c.db", folder / "server.log")
    yield live
    live.stop()


def connect(server: LiveServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def answer(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the one answer ``conn`` gets before it is closed."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


def send_endless(conn: socket.socket, start: bytes, filler: bytes, size: int) -> None:
    """Sends ``start`` and then ``size`` bytes of ``filler``, never ending the head, until the
    server closes the connection."""
    conn.sendall(start)
    try:
        for _ in range(size // len(filler)):
            conn.sendall(filler)
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed: its answer was written before


def assert_error_shape(status: int, headers: dict[str, str], body: bytes, expected: int) -> str:
    assert status == expected, (status, body[:300])
    assert headers["content-type"] == "application/json", headers
    assert IDENTITY_HEADER.lower() in headers, headers
    assert headers.get("connection") == "close", headers
    text = json.loads(body)
    assert text["status"] == expected, text
    return str(text["detail"])


@pytest.mark.parametrize(
    ("start", "filler"),
    [(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a" * (16 * KiB)),
     (b"GET /health?q=", b"a" * (16 * KiB)),
     (b"GET /health HTTP/1.1\r\nHost: x\r\n", b"X-A: b\r\n" * 2048)],
    ids=["header", "url", "many-headers"],
)  # fmt: skip
def test_a_head_that_never_ends_is_answered_431_past_the_limit(
    server: LiveServer, start: bytes, filler: bytes
) -> None:
    """Sent on and on, a head is cut off a little past :data:`HEAD_BYTES` (one read more at most),
    not after the header deadline with everything it sent held."""
    conn = connect(server)
    with conn:
        send_endless(conn, start, filler, 64 * HEAD_BYTES)
        status, headers, body = answer(conn)
    detail = assert_error_shape(status, headers, body, 431)
    assert f"over {HEAD_BYTES} bytes" in detail, detail


def test_a_head_over_the_limit_sent_at_once_is_answered_431_and_not_served(
    server: LiveServer,
) -> None:
    """The read a head begins in was not counted: a 190 KB header sent in one piece, ended, was
    answered 200 (200 KB and more 431). Now it is 431, and the request is never served: a miss
    report behind such a head queues no job."""
    for size in (HEAD_BYTES + 1024, 190_000):
        conn = connect(server)
        with conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size
                         + b"\r\nConnection: close\r\n\r\n")  # fmt: skip
            status, headers, body = answer(conn)
        assert "line and headers" in assert_error_shape(status, headers, body, 431), size
    token = issue_token(server.url, "read")
    key = json.dumps({"key": make_key(m=77).to_json()}).encode()
    conn = connect(server)
    with conn:
        conn.sendall(
            f"POST /v1/misses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(key)}\r\n"
            f"X-Pad: {'p' * 100_000}\r\nConnection: close\r\n\r\n".encode()
            + key
        )
        status, headers, body = answer(conn)
    assert_error_shape(status, headers, body, 431)
    queued = httpx.get(f"{server.url}/v1/jobs", timeout=30).json()["items"]
    assert [j for j in queued if j["key"]["problem"]["M"] == 77] == [], queued


def test_a_request_before_an_oversize_head_is_answered_and_none_after_it_is_served(
    server: LiveServer,
) -> None:
    """Pipelined in one send: a request, a head past the limit, a miss report. The first lost
    its answer to the 431 (a token revocation logged 499, not done); the last must not run."""
    token = issue_token(server.url, "read")
    key = json.dumps({"key": make_key(m=78).to_json()}).encode()
    conn = connect(server)
    with conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                     + b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
                     + f"POST /v1/misses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(key)}\r\n\r\n"
                     .encode() + key)  # fmt: skip
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    first, _, rest = data.partition(b"HTTP/1.1 431")
    assert first.startswith(b"HTTP/1.1 200") and b'"status":"ok"' in first, data[:400]
    assert rest and b"HTTP/1.1" not in rest, data[-400:]  # the 431 last, then closed
    queued = httpx.get(f"{server.url}/v1/jobs", timeout=30).json()["items"]
    assert [j for j in queued if j["key"]["problem"]["M"] == 78] == [], queued


def test_a_head_within_the_limit_and_a_large_body_after_it_are_answered(
    server: LiveServer,
) -> None:
    """Headers up to near the limit are answered; a body is never counted as a head: 200 KiB of
    a read token's body, sent with its head, is judged as a body (not JSON), not as a head."""
    headers = "".join(f"X-Pad-{i}: {'p' * 100}\r\n" for i in range(HEAD_BYTES // 128))
    conn = connect(server)
    with conn:
        conn.sendall(f"GET /health HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n"
                     .encode())  # fmt: skip
        status, _, body = answer(conn)
    assert status == 200, body[:300]
    token = issue_token(server.url, "read")
    content = b"x" * (200 * KiB)
    conn = connect(server)
    with conn:
        conn.sendall(f"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(content)}\r\n"
                     "Connection: close\r\n\r\n".encode() + content)  # fmt: skip
        status, headers_back, body = answer(conn)
    assert_error_shape(status, headers_back, body, 400)


def test_trailers_that_never_end_are_answered_431_and_small_chunks_are_not(
    server: LiveServer,
) -> None:
    """A chunked body's trailers are parsed as headers are: a trailer that never ended was
    held until the body deadline (105 MiB in 8 s). A body of many small chunks, whose framing
    is most of its bytes, is a body all the same."""
    conn = connect(server)
    with conn:
        send_endless(conn, b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n"
                     b"0\r\nX-Trailer: ", b"a" * (16 * KiB), 64 * HEAD_BYTES)  # fmt: skip
        status, headers, body = answer(conn)
    detail = assert_error_shape(status, headers, body, 431)
    assert "trailers" in detail, detail
    token = issue_token(server.url, "read")
    chunks = b"".join(b"1\r\nx\r\n" for _ in range(40 * KiB))  # 200 KiB of framing
    conn = connect(server)
    with conn:
        conn.sendall(f"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                     "Connection: close\r\n\r\n".encode() + chunks + b"0\r\n\r\n")  # fmt: skip
        status, headers, body = answer(conn)
    assert_error_shape(status, headers, body, 400)  # read whole, and not JSON


def test_a_kept_alive_connections_next_head_is_bounded_too(server: LiveServer) -> None:
    """The bound counts each request's head afresh: a first request answered, the second's
    endless header is cut as a first one's is."""
    conn = connect(server)
    with conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b"}" not in first:
            first += conn.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        send_endless(conn, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a" * (16 * KiB),
                     64 * HEAD_BYTES)  # fmt: skip
        status, headers, body = answer(conn)
    assert_error_shape(status, headers, body, 431)


@pytest.mark.parametrize(
    "request_bytes",
    [b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n",
     b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n"],
    ids=["method", "two-lengths"],
)  # fmt: skip
def test_a_request_that_is_not_http_is_a_400_in_the_apis_shape(
    server: LiveServer, request_bytes: bytes
) -> None:
    conn = connect(server)
    with conn:
        conn.sendall(request_bytes)
        status, headers, body = answer(conn)
    detail = assert_error_shape(status, headers, body, 400)
    assert "not valid HTTP/1.1" in detail, detail


def log_since(server: LiveServer, before: int) -> str:
    assert server.db_path is not None
    return (server.db_path.parent / "server.log").read_text(errors="replace")[before:]


def log_size(server: LiveServer) -> int:
    assert server.db_path is not None
    return len((server.db_path.parent / "server.log").read_text(errors="replace"))


def test_a_400_behind_a_request_being_served_logs_no_traceback(server: LiveServer) -> None:
    """A request, then bytes that are not HTTP, in one read: the 400 ends the connection, and
    the request it cut short writes nothing after it (its write after the end was a traceback
    in the log, one per such packet)."""
    before = log_size(server)
    conn = connect(server)
    with conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n\x01bad stuff\r\n\r\n")
        status, headers, body = answer(conn)
    assert_error_shape(status, headers, body, 400)
    time.sleep(0.5)  # the request's task has run
    added = log_since(server, before)
    assert "Traceback" not in added and "ERROR" not in added, added[-2000:]


def test_a_400_and_a_head_past_the_limit_in_one_read_answer_once(server: LiveServer) -> None:
    """A head counted near the limit, then a read that is not HTTP and takes it past: one 400,
    no second answer written after the end (uvloop's fatal error in the log)."""
    before = log_size(server)
    conn = connect(server)
    with conn:
        for part in (b"GET /health HTTP/1.1\r\nX-A: " + b"a" * 40_000, b"a" * 40_000,
                     b"a" * 30_000 + b"\x01\r\n\r\n"):  # fmt: skip
            conn.sendall(part)
            time.sleep(0.2)  # a read each
        status, _, body = answer(conn)
    assert status in (400, 431), body[:300]
    assert body.count(b'"status"') == 1, body[:600]
    time.sleep(0.5)
    added = log_since(server, before)
    assert "Fatal error" not in added and "Traceback" not in added, added[-2000:]
