"""Request bodies held in memory are bounded across connections, not only one by one.

An auditor's 24 connections with a write token, each sending 16 MiB less one byte and then
stalling, took a server process from 114 MiB to 499 MiB. Against a real server: past the
process's budget a body is refused with 503 and ``Retry-After`` before it is read (its answer
comes without its body, not at the body deadline), the server's memory stays within a bound the
budget sets, its bytes come back when the connections close, and one address's anonymous bodies
refuse neither another address's lookups nor a token's.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cache_server.api.limits import (
    ADDRESS_BODIES,
    ANONYMOUS_BODIES,
    TOKEN_BODIES,
    BodyBudget,
    ScopeLimits,
)
from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, issue_token, make_key, make_record

MiB = 2**20
KiB = 2**10
FILLER = b"x" * MiB
WAIT = 2.0  # for an answer sent without the body: the body deadline is 30 s here


@pytest.fixture
def patient_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server whose body deadline (30 s) no test here reaches: an answer is never a 408."""
    env = {"TUNECACHE_SERVER_BODY_SECONDS": "30"}
    live = start_server(f"sqlite:///{tmp_path / 'c.db'}", tmp_path / "c.db",
                        tmp_path / "server.log", env=env)  # fmt: skip
    yield live
    live.stop()


def resident_mb(server: LiveServer, field: str = "VmRSS") -> float:
    """The server process's resident memory now (``VmRSS``) or at its peak (``VmHWM``)."""
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith(field))
    return kb / 1024


def open_body(
    server: LiveServer, path: str, length: int, headers: dict[str, str], source: str = "127.0.0.1"
) -> socket.socket:
    """A connection from ``source`` that has sent a request's head declaring ``length`` body
    bytes, none yet."""
    host, port = server.url.removeprefix("http://").split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {length}",
             "Content-Type: application/json", *(f"{k}: {v}" for k, v in headers.items())]  # fmt: skip
    conn = socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))
    conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return conn


def answered(conn: socket.socket, wait: float = WAIT) -> tuple[int, str] | None:
    """The answer's status and text if one comes within ``wait`` s (else ``None``)."""
    if not select.select([conn], [], [], wait)[0]:
        return None
    data = b""
    while (b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}")) and (
        more := conn.recv(65536)
    ):
        data += more
    return int(data.split(b" ")[1]), data.decode("latin-1")


def send_filler(conn: socket.socket, size: int) -> None:
    """Sends ``size`` body bytes (a JSON parser's error, were they ever parsed)."""
    while size > 0:
        conn.sendall(FILLER[: min(size, MiB)])
        size -= MiB


def test_stalled_write_bodies_past_the_budget_are_refused_at_once(
    patient_server: LiveServer,
) -> None:
    """The auditor's attack: 12 write bodies of 16 MiB less one byte, each stalled before its
    last byte, each of another write token. The budget's worth are held; the others get 503
    without their bodies; memory stays within twice the budget; once the connections close, a
    16 MiB body fits again."""
    server = patient_server
    writes = [{"Authorization": f"Bearer {issue_token(server.url, 'write')}"} for _ in range(12)]
    write = writes[0]
    size = 16 * MiB - 1
    budget_mb = BodyBudget(ScopeLimits()).total / MiB  # the server's defaults
    before = resident_mb(server)
    held: list[socket.socket] = []
    refusals = []
    try:
        for i in range(12):
            conn = open_body(server, "/v1/records", size, writes[i])
            answer = None if i < TOKEN_BODIES else answered(conn)
            if answer is None:  # taken: all but its last byte, then nothing
                send_filler(conn, size - 1)
                held.append(conn)
            else:
                refusals.append(answer)
                conn.close()
        time.sleep(0.5)  # what was sent is read
        peak = resident_mb(server, "VmHWM")
        assert peak < before + 2 * budget_mb, (before, peak, len(held))
    finally:
        for conn in held:
            conn.close()
    assert len(held) == TOKEN_BODIES and len(refusals) == 12 - TOKEN_BODIES
    for status, text in refusals:
        assert status == 503 and "retry-after: 1" in text.lower(), text
        assert "as many bodies of write tokens as it takes at once" in text, text
    assert_fits_again(server, write, size)
    upload = make_record(make_key(m=24)).model_dump(mode="json", by_alias=True)
    assert httpx.post(f"{server.url}/v1/records", json=upload, headers=AUTH,
                      timeout=30).status_code == 201  # fmt: skip
    found = httpx.post(
        f"{server.url}/v1/lookup", json={"key": make_key(m=24).to_json()}, timeout=30
    )
    assert found.status_code == 200, found.text


def assert_fits_again(server: LiveServer, headers: dict[str, str], size: int) -> None:
    """A body of ``size`` is read whole and judged on its content (a 400: not JSON), not
    refused as over the budget: closed connections gave their bytes back."""
    deadline = time.monotonic() + 10  # the server sees the connections close at once, or soon
    while True:
        conn = open_body(server, "/v1/records", size, headers)
        try:
            answer = answered(conn, wait=0.5)
            if answer is None:
                send_filler(conn, size)
                answer = answered(conn, wait=30)
        finally:
            conn.close()
        assert answer is not None
        if answer[0] != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer[0] == 400, answer[1][:400]


def test_one_tokens_stalled_bodies_refuse_no_other_token(patient_server: LiveServer) -> None:
    """A write token's three stalled 16 MiB bodies took the tokens' whole pool: every other
    token's upload over 64 KiB, an admin's too, got 503 for as long as it kept them coming.
    One token's bodies now take at most half of it."""
    server = patient_server
    write = {"Authorization": f"Bearer {issue_token(server.url, 'write')}"}
    size = 16 * MiB - 1
    held: list[socket.socket] = []
    try:
        first = open_body(server, "/v1/records", size, write)
        assert answered(first) is None  # taken
        send_filler(first, size - 1)
        held.append(first)
        for _ in range(2):
            conn = open_body(server, "/v1/records", size, write)
            held.append(conn)
            answer = answered(conn)
            assert answer is not None and answer[0] == 503, answer
            assert "as many bodies of this token (at most half of all write tokens')" in answer[1]
        assert_fits_again(server, AUTH, size)  # another token's, the first still held
        other = {"Authorization": f"Bearer {issue_token(server.url, 'write')}"}
        assert_fits_again(server, other, size)
    finally:
        for conn in held:
            conn.close()
    assert_fits_again(server, write, size)


def test_one_address_anonymous_bodies_refuse_no_one_else(patient_server: LiveServer) -> None:
    """One address holds its share of anonymous bodies (64 KiB each, stalled): its next one
    gets 503 at once, saying so; another address's lookup, and one sent with a token from the
    same address, are answered."""
    server = patient_server
    size = 64 * KiB
    held = []
    for _ in range(ADDRESS_BODIES):
        conn = open_body(server, "/v1/lookup", size, {})
        send_filler(conn, size - 1)
        held.append(conn)
    try:
        conn = open_body(server, "/v1/lookup", size, {})
        answer = answered(conn)
        conn.close()
        assert answer is not None, "a body past this address's share was not refused"
        assert answer[0] == 503 and "without a token from this address" in answer[1], answer
        lookup = {"key": make_key(m=40).to_json()}
        elsewhere = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        with elsewhere:
            miss = elsewhere.post(f"{server.url}/v1/lookup", json=lookup, timeout=30)
        assert miss.status_code == 404, miss.text
        read = {"Authorization": f"Bearer {issue_token(server.url, 'read')}"}
        miss = httpx.post(f"{server.url}/v1/lookup", json=lookup, headers=read, timeout=30)
        assert miss.status_code == 404, miss.text
    finally:
        for conn in held:
            conn.close()


@pytest.mark.parametrize("claimed", [{}, {"Authorization": "Bearer tc_not-a-token"}],
                         ids=["no-token", "a-token-claimed"])  # fmt: skip
def test_addresses_filling_the_tokenless_pool_are_cut_off_for_a_newcomer(
    patient_server: LiveServer, claimed: dict[str, str]
) -> None:
    """The auditor's attack: four addresses each hold their share of stalled 64 KiB bodies, the
    whole pool of bodies without a token (honest lookups were shed for as long as they held it).
    A fifth address's lookup is answered all the same: one stalled body of an address holding
    the most is cut off for it (503, saying so); a body from an address at its share is refused
    as such."""
    server = patient_server
    size = 64 * KiB
    fillers = [f"127.0.0.{2 + i}" for i in range(ANONYMOUS_BODIES // ADDRESS_BODIES)]
    held = []
    try:
        for source in fillers:
            for _ in range(ADDRESS_BODIES):
                held.append(conn := open_body(server, "/v1/lookup", size, claimed, source))
                send_filler(conn, size - 1)
        time.sleep(1.5)  # what was sent is read, and the bodies have stopped arriving
        again = open_body(server, "/v1/lookup", size, {}, fillers[0])
        refused = answered(again)
        again.close()
        assert refused is not None and refused[0] == 503, refused
        assert "from this address" in refused[1], refused
        lookup = {"key": make_key(m=44).to_json()}
        newcomer = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.9"))
        with newcomer:
            miss = newcomer.post(f"{server.url}/v1/lookup", json=lookup, timeout=30)
        assert miss.status_code == 404, miss.text
        cut = [a for conn in held if (a := answered(conn, wait=0.05)) is not None]
        assert len(cut) == 1, cut
        assert cut[0][0] == 503 and "had stopped arriving" in cut[0][1], cut
        assert "retry-after: 1" in cut[0][1].lower(), cut
    finally:
        for conn in held:
            conn.close()


def test_a_body_still_arriving_is_never_cut_for_stalled_ones(patient_server: LiveServer) -> None:
    """An honest client sends its 64,000-byte body slowly (2 KB every 0.1 s) while 320
    addresses each declare a body a little smaller and send nothing: cut by holdings alone,
    the honest body was cut for them. It arrives whole and is judged on its content (not JSON:
    400); the stalled ones are what is cut or refused."""
    server = patient_server
    honest = open_body(server, "/v1/lookup", 64_000, {}, "127.0.0.9")
    stalled, sent = [], 0
    try:
        for i in range(32):
            send_filler(honest, 2000)
            sent += 2000
            for j in range(10):
                stalled.append(open_body(server, "/v1/lookup", 63_000, {},
                                         f"127.0.{1 + (10 * i + j) // 250}.{1 + (10 * i + j) % 250}"))  # fmt: skip
            time.sleep(0.1)
        send_filler(honest, 64_000 - sent)
        answer = answered(honest, wait=30)
        shed = [a[0] for conn in stalled if (a := answered(conn, wait=0.01)) is not None]
    finally:
        honest.close()
        for conn in stalled:
            conn.close()
    assert answer is not None and answer[0] == 400, answer
    assert shed and set(shed) == {503}, shed  # the pool was full: stalled bodies were refused


@pytest.mark.parametrize("token", [False, True], ids=["anonymous", "token"])
def test_a_body_without_a_token_is_given_back_as_its_answer_starts(token: bool) -> None:
    """A request's body bytes were held until its answer drained: four addresses' connections
    that never read their answers kept the anonymous pool full (every tokenless lookup
    refused). One without a token is given back as its answer starts (the first message: load
    shedding holds the start back until the body is made); a token's stays charged until the
    request ends, which a client that stops reading reaches within the server's drain deadline
    (tests/test_slow_readers.py): given back earlier, requests stuck behind unread answers kept
    their 16 MiB bodies in memory, uncounted."""
    import asyncio

    from cache_server.api.limits import BodyLimits

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        await receive()  # type: ignore[operator]
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"{}"})  # type: ignore[operator]

    async def rejected(*_: object) -> None:
        raise AssertionError("refused")

    limits = BodyLimits(app, limits=ScopeLimits(), authenticate=lambda _: "write",
                        seconds=5, reject=rejected)  # fmt: skip
    size = 2 * ScopeLimits().anonymous if token else 1000  # a token's is checked past 64 KiB
    held: list[int] = []
    unread = asyncio.Event()

    async def run() -> None:
        body = [{"type": "http.request", "body": b"x" * size, "more_body": False}]

        async def receive() -> dict[str, object]:
            return body.pop() if body else {"type": "http.disconnect"}

        async def send(message: dict[str, object]) -> None:
            held.append(limits.budget.held)
            await unread.wait()  # a client that does not read: the first send waits

        headers = [(b"authorization", b"Bearer tc_x"), (b"content-length", str(size).encode())]
        scope = {"type": "http", "method": "POST", "path": "/v1/records", "client": ("10.0.0.1", 5),
                 "headers": headers if token else headers[1:]}  # fmt: skip
        task = asyncio.create_task(limits(scope, receive, send))
        await asyncio.sleep(0.2)
        assert held == [size if token else 0] and limits.budget.held == held[0]
        unread.set()
        await task
        assert limits.budget.held == 0  # whatever it held, given back as the request ended

    asyncio.run(run())


def test_one_read_or_verify_token_takes_half_of_their_pool_and_is_told_so() -> None:
    """A read token's share was half of the tokens' pool, which is the whole of the read and
    verify pool: one read token refused every verifier's body. A token's streamed body over its
    share was told it was a body without a token (its bytes had gone back there)."""
    import asyncio
    import hashlib

    from cache_server.api.limits import BodyLimits, Hold

    limits = ScopeLimits()
    budget = BodyBudget(limits)
    reader, verifier = Hold("10.0.0.1"), Hold("10.0.0.2")
    assert budget.move(reader, "read", b"r") and budget.move(verifier, "verify", b"v")
    assert budget.take(reader, budget.read_limit // 2) and not budget.take(reader, 1)
    assert budget.take(verifier, limits.read)  # the pool has room for another token

    said: list[tuple[int, str]] = []

    async def reject(send: object, status: int, detail: str, *_: object) -> None:
        said.append((status, detail))

    async def app(*_: object) -> None:
        raise AssertionError("a body over its token's share reached the app")

    guard = BodyLimits(app, limits=limits, authenticate=lambda _: "read", seconds=5,
                       reject=reject, budget=budget)  # fmt: skip
    budget.by_token[hashlib.sha256(b"tc_r").digest()] = budget.read_token_limit  # it holds all

    async def run() -> None:
        chunk = b"x" * (2 * limits.anonymous)  # past an anonymous body: its token is checked
        body = [{"type": "http.request", "body": chunk, "more_body": True}]

        async def receive() -> dict[str, object]:
            return body.pop() if body else {"type": "http.disconnect"}

        scope = {"type": "http", "method": "POST", "path": "/v1/disputes",
                 "client": ("10.0.0.3", 5), "headers": [(b"authorization", b"Bearer tc_r")]}  # fmt: skip
        await guard(scope, receive, lambda message: asyncio.sleep(0))

    asyncio.run(run())
    assert said == [(503, said[0][1])] and "bodies of this token (at most half of all read" in (
        said[0][1]), said  # fmt: skip
