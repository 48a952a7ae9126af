"""Every client call ends within its stated timeout (+10 %), whatever the server does: trickle
its body or its headers one byte at a time, or never answer. And a wrong URL is named as such.

The servers are hostile at the socket (:mod:`tests.hostile`): the client's transport is what is
under test. The times are wall-clock bounds, not speed: a call that waited for the server would
take a minute or more here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from cache_server.embedded import free_port
from tests.factories import make_key, make_record
from tests.hostile import Behaviour, not_tunecache, serve, silent, trickle_body, trickle_headers
from tunecache import Client, ServerError
from tunecache.http import Timeout

SECONDS = 1.0
BOUND = SECONDS * 1.1
HOSTILE = [trickle_body, trickle_headers, silent]
DEFAULT = {"schedule": "default"}


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """How long ``call()`` took, and what it returned (or raised)."""
    started = time.monotonic()
    try:
        result: Any = call()
    except Exception as exc:
        result = exc
    return time.monotonic() - started, result


@pytest.mark.parametrize("behaviour", HOSTILE, ids=lambda b: b.__name__)
def test_a_lookup_ends_within_its_timeout(behaviour: Behaviour) -> None:
    with serve(behaviour) as (url, seen), Client(url, timeout=SECONDS) as client:
        elapsed, result = timed(lambda: client.lookup(make_key(), default=DEFAULT))
        assert seen.requests == ["POST /v1/lookup"]
    assert elapsed <= BOUND, f"{behaviour.__name__}: a {SECONDS} s lookup took {elapsed:.2f} s"
    assert result.source == "default" and result.config == DEFAULT


@pytest.mark.parametrize("behaviour", HOSTILE, ids=lambda b: b.__name__)
def test_every_api_call_ends_within_its_timeout(behaviour: Behaviour) -> None:
    limits = Timeout(lookup=SECONDS, write=SECONDS)
    with serve(behaviour) as (url, _), Client(url, timeout=limits) as client:
        calls: dict[str, Callable[[], Any]] = {
            "fetch": lambda: client.fetch(make_key()),
            "upload": lambda: client.upload(make_record()),
            "sync (export_snapshot)": lambda: client.export_snapshot("cpu-avx2"),
            "artifacts": lambda: client.get_artifacts("tvm.record", "p", timeout=SECONDS),
            "whoami": lambda: client.whoami(timeout=SECONDS),
        }
        for name, call in calls.items():
            elapsed, result = timed(call)
            assert elapsed <= BOUND, f"{name}: {elapsed:.2f} s against {SECONDS} s"
            assert isinstance(result, ServerError), f"{name}: {result!r}"


@pytest.mark.parametrize("behaviour", HOSTILE, ids=lambda b: b.__name__)
def test_the_inductor_integration_is_bounded(behaviour: Behaviour) -> None:
    pytest.importorskip("torch")
    import tunecache.inductor
    from tunecache.inductor import TeamCacheWarning
    from tunecache.inductor.partition import partition

    partition()  # Inductor's system hash, once: not the server's time
    with serve(behaviour) as (url, _), pytest.warns(TeamCacheWarning):
        elapsed, enabled = timed(lambda: tunecache.inductor.enable(url, "", timeout=SECONDS))
    assert elapsed <= BOUND + 0.2, f"enable() took {elapsed:.2f} s against {SECONDS} s"
    assert not enabled.reachable


@pytest.mark.parametrize("behaviour", HOSTILE, ids=lambda b: b.__name__)
def test_the_tvm_database_reads_are_bounded(behaviour: Behaviour) -> None:
    from tunecache.tvm.remote import Remote

    with serve(behaviour) as (url, _):
        remote = Remote(url, "", SECONDS, "partition")
        elapsed, items = timed(lambda: remote.get("tvm.record", "key", 8))
        remote.close()
    assert elapsed <= BOUND and items is None and remote.down is not None


def test_a_wrong_url_is_not_a_miss(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tunecache")
    with serve(not_tunecache) as (url, _), Client(url, retry_after=0.0) as client:
        results = [client.lookup(make_key(m=m), default=DEFAULT) for m in (8, 16)]
        with pytest.raises(ServerError, match="not a tunecache server"):
            client.fetch(make_key())
        with pytest.raises(ServerError, match="not a tunecache server") as refused:
            client.upload(make_record())
    assert all(r.source == "default" for r in results)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not a tunecache server" in warnings[0], warnings
    assert "<html>" not in str(refused.value)  # one line, not the page


def test_an_upload_never_waits_and_honours_the_down_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serve(silent) as (url, seen), Client(url, timeout=Timeout(lookup=0.3, write=30)) as c:
        elapsed, queued = timed(lambda: c.upload_later(make_record()))
        assert queued and elapsed < 3.0  # not the 30 s the silent server would hold a send
        time.sleep(0.2)
        assert seen.requests == ["POST /v1/records"]  # sent, and still waiting: not on us
        assert c.lookup(make_key(), default=DEFAULT).source == "default"  # times out: down
        elapsed, queued = timed(lambda: c.upload_later(make_record(make_key(m=8))))
        assert queued and elapsed < 3.0  # kept for when the server is back, not dropped
        time.sleep(0.3)
        assert seen.requests == ["POST /v1/records", "POST /v1/lookup"]  # not sent while down
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("2 upload(s)" in message and "not sent" in message for message in warned), warned


def test_closing_does_not_wait_for_a_server_that_will_not_be_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A process whose server is down exits at once: it waited the whole 5 s (a user's script
    took 7.9 s instead of 2.8 s) for uploads that could not be sent before it gave up."""
    client = Client(f"http://127.0.0.1:{free_port()}", timeout=Timeout(lookup=0.3, write=30))
    assert client.lookup(make_key(), default=DEFAULT).source == "default"  # refused: down
    assert client.upload_later(make_record())
    elapsed, _ = timed(client.close)
    assert elapsed < 1.0, f"closing waited {elapsed:.2f} s"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("1 upload(s)" in m and "not sent: it failed less than 30 s ago" in m
               for m in warned), warned  # fmt: skip


def test_sync_against_a_trickling_server_gives_up_at_its_timeout(tmp_path: Any) -> None:
    import subprocess
    import sys

    with serve(trickle_body) as (url, _):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "tunecache_cli", "sync", "--server", url,
                               "--arch", "cpu-avx2", "--timeout", "1", "-o",
                               str(tmp_path / "s.json")],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert "timed out" in done.stderr.lower() or "deadline" in done.stderr.lower(), done.stderr
    assert elapsed < 15  # the interpreter's start, then 1 s: a trickle never holds it longer
    assert not (tmp_path / "s.json").exists()


def test_an_upload_to_a_server_that_reads_slowly_ends_at_its_deadline() -> None:
    """A socket write waits its timeout per send(): a server draining a kilobyte at a time
    would stretch one write past the deadline. Writes go in pieces, each bounded."""
    from tests.hostile import serve_slow_reader

    document = {"records": [], "padding": "x" * (32 * 2**20)}  # more than socket buffers hold
    with serve_slow_reader() as (url, seen), Client(url, timeout=Timeout(write=SECONDS)) as c:
        elapsed, result = timed(lambda: c.import_snapshot(document))
        assert seen.requests == ["POST /v1/snapshot HTTP/1.1"]
    assert isinstance(result, ServerError) and elapsed <= BOUND, (elapsed, result)


def test_a_name_lookup_that_hangs_ends_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver has no timeout of its own: a hung one would hold a lookup for as long as it
    takes. It runs beside the call, which gives up at its deadline."""
    import socket

    real = socket.getaddrinfo

    def hung(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "slow-dns.invalid":
            time.sleep(5)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hung)
    with Client("http://slow-dns.invalid:8765", timeout=SECONDS) as client:
        elapsed, result = timed(lambda: client.lookup(make_key(), default=DEFAULT))
    assert elapsed <= BOUND and result.source == "default"


def test_an_old_servers_miss_is_a_miss() -> None:
    """A server from before the identity header answers a miss in tunecache's error shape: a
    miss, not 'not a tunecache server'."""
    import httpx

    shaped = httpx.MockTransport(lambda request: httpx.Response(
        404, json={"status": 404, "detail": "no validated record", "errors": []}))  # fmt: skip
    with Client("http://old.test", transport=shaped) as client:
        assert client.fetch(make_key()) is None


def test_an_upload_queued_while_the_server_is_down_is_sent_when_it_is_back() -> None:
    import httpx

    sent: list[str] = []
    down = [True]

    def answer(request: httpx.Request) -> httpx.Response:
        if down[0]:
            raise httpx.ConnectError("refused", request=request)
        sent.append(request.url.path)
        return httpx.Response(201, json={"record_id": 1, "key_hash": "0" * 64,
                                         "winner_record_id": 1, "is_winner": True,
                                         "status": "pending", "policy": "validated"})  # fmt: skip

    with Client("http://flaky.test", transport=httpx.MockTransport(answer),
                retry_after=0.3) as client:  # fmt: skip
        assert client.lookup(make_key(), default=DEFAULT).source == "default"  # down now
        assert client.upload_later(make_record())  # queued, not dropped
        down[0] = False
        assert client.drain(timeout=5)
    assert sent == ["/v1/records"]


def test_environment_proxies_are_used_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY names a proxy (here one that trickles): the client goes through it, within
    the same deadline."""
    with serve(trickle_headers) as (proxy, seen):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with Client("http://cache.internal.test:8765", timeout=SECONDS) as client:
            elapsed, result = timed(lambda: client.lookup(make_key(), default=DEFAULT))
        assert seen.requests == ["POST http://cache.internal.test:8765/v1/lookup"]
    assert elapsed <= BOUND and result.source == "default"
