"""The run-time client: memo, misses, a dead or broken server, and a real server."""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import httpx
import numpy as np
import pytest

from cache_server.embedded import free_port
from tests.conftest import LiveServer
from tests.factories import default_config, make_key, make_record, miss
from tunecache import Client, ServerError
from tunecache.errors import InvalidInput
from tunecache.http import Timeout
from tunecache.key import Key
from tunecache.schemas import LookupResponse, RecordPublic

DEFAULT = {"schedule": "default"}


def stored(record) -> RecordPublic:  # type: ignore[no-untyped-def]
    return RecordPublic(
        **record.model_dump(), id=7, key_hash=record.key.digest(), created_at=datetime.now(UTC)
    )


class CountingTransport(httpx.MockTransport):
    """An in-memory server: answers lookups from a dict and counts requests."""

    def __init__(self, records: dict[str, RecordPublic]) -> None:
        self.calls = 0
        self.records = records
        super().__init__(self.answer)

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        key = Key.from_json(json.loads(request.content)["key"])
        hit = self.records.get(key.digest())
        if hit is None:
            return miss()
        return httpx.Response(
            200, content=LookupResponse(record=hit).model_dump_json(by_alias=True)
        )


def test_hit_is_memoised_and_miss_is_remembered() -> None:
    key, other = make_key(m=64), make_key(m=128)
    transport = CountingTransport({key.digest(): stored(make_record(key, time_ms=1.5))})
    with Client("http://cache.test", transport=transport, miss_ttl=60) as client:
        first = client.lookup(key, default=DEFAULT)
        second = client.lookup(key, default=DEFAULT)
        miss1 = client.lookup(other, default=DEFAULT)
        miss2 = client.lookup(other, default=DEFAULT)
    assert (first.source, second.source) == ("server", "memo")
    assert first.hit and first.config == default_config(make_key())
    assert (miss1.source, miss2.source) == ("default", "default")
    assert miss1.config == DEFAULT and not miss1.hit
    assert transport.calls == 2  # one per key: the memo and the miss TTL answered the rest


def test_without_a_default_the_backend_default_config_is_returned() -> None:
    transport = CountingTransport({})
    with Client("http://cache.test", transport=transport) as client:
        tvm = client.lookup(make_key(backend="tvm"))
        inductor = client.lookup(make_key(backend="inductor"))
    assert tvm.config == {"schedule": "default"} and inductor.config == {"mode": "default"}
    tvm.config["schedule"] = "mutated"  # a caller's edit must not leak into the next fallback
    with Client("http://cache.test", transport=transport) as client:
        assert client.lookup(make_key(m=3, backend="tvm")).config == {"schedule": "default"}


def test_miss_is_asked_again_after_its_ttl() -> None:
    key = make_key()
    transport = CountingTransport({})
    with Client("http://cache.test", transport=transport, miss_ttl=0.05) as client:
        client.lookup(key)
        time.sleep(0.1)
        client.lookup(key)
    assert transport.calls == 2


def test_garbage_answer_falls_back_to_default() -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=b"<html>proxy</html>"))
    with Client("http://cache.test", transport=transport) as client:
        result = client.lookup(make_key(), default=DEFAULT)
    assert result.config == DEFAULT and result.source == "default"


def test_server_error_falls_back_to_default() -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(503, text="overloaded"))
    with Client("http://cache.test", transport=transport) as client:
        assert client.lookup(make_key(), default=DEFAULT).config == DEFAULT
        with pytest.raises(ServerError, match="503"):
            client.fetch(make_key())


def test_dead_server_never_raises_logs_once_and_is_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    caplog.set_level(logging.DEBUG, logger="tunecache.client")
    with Client(url, timeout=0.5, retry_after=0.0) as client:
        started = time.monotonic()
        results = [client.lookup(make_key(m=m), default=DEFAULT) for m in (8, 16, 32)]
        elapsed = time.monotonic() - started
    assert all(r.config == DEFAULT and r.source == "default" for r in results)
    assert elapsed < 3 * 0.5 + 1.0  # each lookup bounded by its timeout
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and url in warnings[0].getMessage()


def test_connect_timeout_falls_back_to_default() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    with Client("http://cache.test", transport=httpx.MockTransport(hang)) as client:
        assert client.lookup(make_key(), default=DEFAULT).config == DEFAULT


def test_after_a_failure_the_server_is_skipped_for_retry_after() -> None:
    calls = 0

    def refuse(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused", request=request)

    with Client(
        "http://cache.test", transport=httpx.MockTransport(refuse), retry_after=60
    ) as client:
        for m in (8, 16, 32, 64):
            assert client.lookup(make_key(m=m), default=DEFAULT).source == "default"
    assert calls == 1


def test_real_server_round_trip(server: LiveServer) -> None:
    key = make_key(m=256)
    with Client(server.url) as client:
        assert client.lookup(key, default=DEFAULT).source == "default"
        uploaded = client.upload(make_record(key, time_ms=0.75))
        assert uploaded.is_winner
        # The miss above is remembered; a new client sees the upload at once.
    with Client(server.url) as client:
        result = client.lookup(key, default=DEFAULT)
        assert result.source == "server" and result.record is not None
        assert result.record.id == uploaded.record_id
        assert client.list_records(kernel="matmul").count == 1
        assert client.health()["records"] == 1


@pytest.mark.parametrize("path", ["/v1", "/tc"])
def test_a_server_url_with_a_path_is_said_and_never_taken_for_a_miss(
    server: LiveServer, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = make_key(m=256)
    with Client(server.url) as client:
        client.upload(make_record(key, time_ms=0.75))
    with Client(server.url + path) as client:  # every path under it is none of the server's
        with pytest.raises(ServerError, match=f"→ 404: .* no such path: is the server URL its "
                           f"root \\(such as http://host:8765, without {path}\\)"):  # fmt: skip
            client.fetch(key)
        with pytest.raises(ServerError, match=f"without {path}"):
            client.list_records()
        assert client.lookup(key, default=DEFAULT).source == "default"  # still never raises
    assert f"without {path}" in caplog.text  # but says why, instead of a silent miss
    with Client(server.url) as client:
        assert client.fetch(make_key(m=512)) is None  # a miss is still a miss
        with pytest.raises(ServerError, match="no such path: a server older than this client"):
            client._call("GET", "/v1/added-later", read=True)  # the right URL, an older server


def test_upload_rejection_raises_server_error_with_reason(server: LiveServer) -> None:
    record = make_record()
    body = record.model_dump(mode="json", by_alias=True)
    body["timing"]["median_ms"] = -1
    with Client(server.url) as client, pytest.raises(ServerError) as info:
        client._call("POST", "/v1/records", json=body)
    assert info.value.status_code == 422
    assert "median_ms" in str(info.value)


def test_a_snapshot_path_may_be_a_str_and_a_bad_policy_fails_at_construction(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-snapshot.json"
    with Client("http://127.0.0.1:9", snapshot=str(missing), timeout=0.2) as client:
        result = client.lookup(make_key(), default={"tile": 1})
    assert (result.source, result.config) == ("default", {"tile": 1})
    with pytest.raises(InvalidInput, match="policy='loose': expected one of strict"):
        Client("http://127.0.0.1:9", policy="loose")  # type: ignore[arg-type]
    # timeout="x" raised float()'s "could not convert string to float", naming nothing; True
    # was taken for one second.
    for bad in ("x", True, float("nan"), 0):
        with pytest.raises(InvalidInput, match=r"Timeout.lookup \(a client's timeout=\) must be a"):
            Client("http://127.0.0.1:9", timeout=bad)  # type: ignore[arg-type]
    # milliseconds meant: each lookup of a silent server held the process 8 minutes (refused
    # in TUNECACHE_TIMEOUT, taken here)
    for bad in (500, 10**6, float("inf")):
        with pytest.raises(InvalidInput, match=r"timeout=\) must be (at most 60 seconds|a pos)"):
            Client("http://127.0.0.1:9", timeout=bad)
    with pytest.raises(InvalidInput, match=r"Timeout\.connect"):
        Client("http://127.0.0.1:9", timeout=Timeout(lookup=1, connect=120))
    assert (
        Client("http://127.0.0.1:9", timeout=Timeout(lookup=60, write=3600)).timeout.write == 3600
    )
    for number in (Decimal("2"), Fraction(1, 2), np.float32(0.5), np.int64(2)):  # any number
        assert Client("http://127.0.0.1:9", timeout=number).timeout.lookup == float(number)  # type: ignore[arg-type]


@pytest.mark.parametrize(("lacks", "said"), [("kernel_packages", "kernel package"),
                                             ("sources", "kernel version")])  # fmt: skip
def test_a_claim_on_a_server_older_than_a_filter_is_sent_again_without_it(
    lacks: str, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A server from before ``kernel_packages`` (or ``sources``, the kernels' versions) refuses
    the field (422): the daemon warns and claims without it (failing a job it cannot run)
    instead of dying on every claim; the other filter is still sent."""
    bodies: list[dict[str, object]] = []

    def old_server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if lacks in body:
            detail = [{"type": "extra_forbidden", "loc": ["body", lacks],
                       "msg": "Extra inputs are not permitted"}]  # fmt: skip
            return httpx.Response(422, json={"detail": detail},
                                  headers={"Tunecache-Server": "tunecache/0.1.0"})  # fmt: skip
        return httpx.Response(204, headers={"Tunecache-Server": "tunecache/0.1.0"})

    filters = {"kernel_packages": ["mypkg"], "sources": [("matmul", "tvm", "ab12")]}
    sent = sorted(["lease_seconds", "worker", *filters])
    kept = sorted(["lease_seconds", "worker", *(f for f in filters if f != lacks)])
    with Client("http://old.test", transport=httpx.MockTransport(old_server)) as client:
        assert client.claim_job("w", **filters) is None  # type: ignore[arg-type]
        assert client.claim_job("w", **filters) is None  # type: ignore[arg-type]  # refused once
    assert [sorted(b) for b in bodies] == [sent, kept, kept]
    assert f"cannot filter claims by {said}" in caplog.text


@pytest.mark.parametrize("status", [300, 301, 302, 303, 305, 307, 308, 399, 203, 206])
def test_a_lookup_redirected_with_a_record_in_its_body_is_no_hit(status: int) -> None:
    """A redirect's body was read as the answer: every other call refuses a redirect, and a
    lookup that follows none has no answer from the server it asked."""
    key = make_key(m=64)
    hit = stored(make_record(key, time_ms=1.5))

    def redirect(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"location": "http://elsewhere.test/v1/lookup"},
                              content=LookupResponse(record=hit).model_dump_json(by_alias=True))  # fmt: skip

    with Client("http://cache.test", transport=httpx.MockTransport(redirect)) as client:
        said = ("redirected to 'http://elsewhere.test/v1/lookup'" if status >= 300
                else f"→ {status}: a hit is a 200, a miss a 404")  # fmt: skip
        with pytest.raises(ServerError, match=re.escape(said)):
            client.fetch_answer(key)
        result = client.lookup(key, default=DEFAULT)
    assert (result.source, result.config, result.hit) == ("default", DEFAULT, False)
