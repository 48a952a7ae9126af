"""The client's environment variables: only those of what was not given are read, and each is
refused, naming it, where its value would fail later (an infinite or millisecond timeout)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from tests.factories import make_key, miss
from tunecache import Client
from tunecache.errors import InvalidInput
from tunecache.settings import MAX_LOOKUP_TIMEOUT, Settings, settings_without_bad
from tunecache.triton import shared_client as shared


@pytest.fixture
def fresh_drop_in() -> Iterator[None]:
    """The drop-in's settings read again, and its one client made again, for this test."""
    shared._read.cache_clear()
    shared._shared_client.cache_clear()
    yield
    shared._read.cache_clear()
    shared._shared_client.cache_clear()


@pytest.mark.parametrize("raw", ["inf", "-inf", "Infinity", "nan", "1e999"])
def test_a_timeout_that_is_not_finite_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(InvalidInput, match=f"TUNECACHE_TIMEOUT='{raw}' must be more than 0"):
        Settings.from_env({"TUNECACHE_TIMEOUT": raw})
    found, problems = settings_without_bad({"TUNECACHE_TIMEOUT": raw, "TUNECACHE_TOKEN": "tc_x"})
    assert (found.timeout, found.token, len(problems)) == (0.5, "tc_x", 1)


def test_a_plain_client_refuses_an_infinite_timeout_as_invalid_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TUNECACHE_TIMEOUT", "inf")
    with pytest.raises(InvalidInput, match="TUNECACHE_TIMEOUT='inf'"):
        Client("http://127.0.0.1:9")


def test_the_drop_in_takes_an_infinite_timeout_as_unset_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fresh_drop_in: None
) -> None:
    """It raised ValueError from ``Timeout`` through the user's first kernel launch."""
    monkeypatch.setenv("TUNECACHE_TIMEOUT", "inf")
    monkeypatch.setenv("TUNECACHE_URL", "http://127.0.0.1:9")
    with caplog.at_level(logging.WARNING):
        client = shared.shared_client(None, None, "strict")
    try:
        assert client.timeout.lookup == 0.5
        assert client.lookup(make_key(), default={"tile": 1}).config == {"tile": 1}
    finally:
        client.close()
    said = [r.getMessage() for r in caplog.records if "TUNECACHE_TIMEOUT" in r.getMessage()]
    assert len(said) == 1 and "taking it as unset" in said[0]


@pytest.mark.parametrize("raw", ["500", "60.5", "3600"])
def test_a_timeout_over_a_minute_is_refused_as_likely_milliseconds(raw: str) -> None:
    """``TUNECACHE_TIMEOUT=500`` meant half a second: taken as seconds, a silent server held
    each lookup for over 8 minutes."""
    with pytest.raises(InvalidInput, match=r"at most 60: it is in seconds \(0.5: half"):
        Settings.from_env({"TUNECACHE_TIMEOUT": raw})


@pytest.mark.parametrize("raw", ["0.05", "2", "60", f"{MAX_LOOKUP_TIMEOUT:g}"])
def test_a_timeout_up_to_a_minute_is_taken(raw: str) -> None:
    assert Settings.from_env({"TUNECACHE_TIMEOUT": raw}).timeout == float(raw)


def recording() -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A server that misses every key, and the requests it was sent."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return miss()

    return httpx.MockTransport(answer), sent


def test_a_client_given_a_timeout_never_reads_tunecache_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TUNECACHE_TIMEOUT", "abc")
    transport, _ = recording()
    with Client("http://cache.test", timeout=0.5, transport=transport) as client:
        assert client.timeout.lookup == 0.5
        assert client.lookup(make_key(), default={"tile": 1}).source == "default"
    monkeypatch.setenv("TUNECACHE_URL", "http://cache.test")  # nor when the URL comes from it
    with Client(timeout=0.25, token="", transport=transport) as client:
        assert (client.url, client.timeout.lookup) == ("http://cache.test", 0.25)
    with pytest.raises(InvalidInput, match="TUNECACHE_TIMEOUT='abc'"):
        Client("http://cache.test")  # read when not given: still refused


def test_a_client_given_a_token_never_reads_tunecache_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TUNECACHE_TOKEN", "tc_a b")
    with Client("http://cache.test", timeout=0.5, token="tc_given") as client:
        assert client._headers["Authorization"] == "Bearer tc_given"
    with pytest.raises(InvalidInput, match=r"TUNECACHE_TOKEN=\(not shown\) holds ' ' at"):
        Client("http://cache.test", timeout=0.5)  # a space inside: refused


@pytest.mark.parametrize("raw", ["tc_secret\n", "tc_secret\r\n", "  tc_secret\t"])
def test_a_token_read_from_a_secret_file_is_sent_without_its_newline(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mounted Kubernetes secret read into the variable ends with a newline: refused, it
    stopped every client, even one given its URL and timeout."""
    monkeypatch.setenv("TUNECACHE_TOKEN", raw)
    transport, sent = recording()
    with Client("http://cache.test", timeout=0.5, transport=transport) as client:
        client.lookup(make_key(), default={"tile": 1})
    assert [r.headers["Authorization"] for r in sent] == ["Bearer tc_secret"]
    assert Settings.from_env({"TUNECACHE_TOKEN": raw}).token == "tc_secret"
    with Client("http://cache.test", timeout=0.5, token=raw, transport=transport) as client:
        assert client._headers["Authorization"] == "Bearer tc_secret"  # given: the same
    assert Settings.from_env({"TUNECACHE_TOKEN": " \n"}).token is None  # blank: none


@pytest.mark.parametrize("token", ["tc_a\nb", "tc_a b", "tc_a\x00b"])
def test_a_token_with_whitespace_or_a_control_inside_stays_refused(token: str) -> None:
    with pytest.raises(InvalidInput, match=r"TUNECACHE_TOKEN=\(not shown\) holds .* at position 4"):
        Settings.from_env({"TUNECACHE_TOKEN": f"\n{token}\n"})
