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
    assert elapsed <= BOUND and items == [] and remote.down is not None


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
        assert queued and elapsed < 0.1
        time.sleep(0.2)
        assert seen.requests == ["POST /v1/records"]  # sent, and still waiting: not on us
        assert c.lookup(make_key(), default=DEFAULT).source == "default"  # times out: down
        elapsed, queued = timed(lambda: c.upload_later(make_record(make_key(m=8))))
        assert not queued and elapsed < 0.1
        assert seen.requests == ["POST /v1/records", "POST /v1/lookup"]
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("skipped" in message for message in skipped), skipped


def test_sync_against_a_trickling_server_gives_up_at_its_timeout(tmp_path: Any) -> None:
    import subprocess
    import sys

    with serve(trickle_body) as (url, _):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "tunecache.cli", "sync", "--server", url,
                               "--arch", "cpu-avx2", "--timeout", "1", "-o",
                               str(tmp_path / "s.json")],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert "timed out" in done.stderr.lower() or "deadline" in done.stderr.lower(), done.stderr
    assert elapsed < 15  # the interpreter's start, then 1 s: a trickle never holds it longer
    assert not (tmp_path / "s.json").exists()
