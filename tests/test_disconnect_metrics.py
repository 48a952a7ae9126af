"""A client that goes away before its request is answered is no server error.

Any client, with no token, could send a POST's headers (and part of its body), close, and have
the server log and count a 500: a thousand fake server errors a second from one client. Such a
request is counted and logged as 499 (client closed request), never 500.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer

SERIES = re.compile(r"^tunecache_http_requests_total\{([^}]*)\} ([0-9.e+]+)$", re.MULTILINE)


def requests_by_status(url: str) -> dict[str, float]:
    """``tunecache_http_requests_total`` summed by status, from the server's ``/metrics``."""
    counts: dict[str, float] = {}
    for labels, value in SERIES.findall(httpx.get(f"{url}/metrics", timeout=10).text):
        status = re.search(r'status="(\d+)"', labels)
        assert status is not None, labels
        counts[status[1]] = counts.get(status[1], 0.0) + float(value)
    return counts


def send_and_close(url: str, path: str, request_id: str, partial: bytes) -> None:
    """Sends a POST's headers, declaring a body of 10 bytes, and ``partial`` of it; closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 10\r\nX-Request-ID: {request_id}\r\n\r\n".encode()
            + partial
        )


@pytest.mark.parametrize("partial", [b"", b'{"ke'], ids=["headers only", "part of the body"])
def test_a_client_that_closes_before_its_body_is_counted_as_499_not_500(
    server: LiveServer, tmp_path: Path, partial: bytes
) -> None:
    before = requests_by_status(server.url)
    for n in range(5):
        send_and_close(server.url, "/v1/lookup", f"gone-{n}", partial)
    deadline = time.monotonic() + 30
    while (after := requests_by_status(server.url)).get("499", 0.0) < 5:
        assert time.monotonic() < deadline, after
        time.sleep(0.1)
    assert after.get("500", 0.0) == before.get("500", 0.0) == 0.0, after
    assert after["499"] == 5
    log = (tmp_path / "server.log").read_text()
    lines = [line for line in log.splitlines() if "id=gone-" in line]
    assert len(lines) == 5, log[-3000:]
    assert all(" /v1/lookup 499 " in line for line in lines), lines
    assert " 500 " not in log, log[-3000:]
