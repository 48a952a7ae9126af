"""Misses become jobs, rate-limited per caller and server-wide; the client can report its misses."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from cache_server.db import make_engine
from cache_server.ratelimit import RateLimiter
from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, issue_token, make_key
from tunecache.client import Client


def report(url: str, m: int, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"key": make_key(m=m).to_json()}
    return httpx.post(f"{url}/v1/misses", json=body, headers=headers or {}, timeout=30)


def jobs(url: str) -> list[dict]:  # type: ignore[type-arg]
    items: list[dict] = httpx.get(f"{url}/v1/jobs", timeout=30).json()["items"]  # type: ignore[type-arg]
    return items


def test_limiter_refills_at_its_rate_and_forgets_idle_callers() -> None:
    now = [0.0]
    limit = RateLimiter(per_minute=60, clock=lambda: now[0])
    assert [limit.wait("a") for _ in range(60)] == [0.0] * 60  # a full burst
    assert limit.wait("a") == pytest.approx(1.0)  # one token a second
    now[0] = 0.5
    assert limit.wait("a") == pytest.approx(0.5)
    now[0] = 1.0
    assert limit.wait("a") == 0.0 and limit.wait("a") > 0
    now[0] = 1_000.0
    assert [limit.wait("a") for _ in range(60)] == [0.0] * 60  # refilled, never beyond capacity
    assert limit.wait("a") > 0
    with pytest.raises(ValueError, match="per_minute"):
        RateLimiter(per_minute=0)


def test_each_caller_gets_its_own_report_budget(tmp_path: Path) -> None:
    db_path = tmp_path / "cache.db"
    live = start_server(
        f"sqlite:///{db_path}", db_path, tmp_path / "server.log",
        env={"TUNECACHE_SERVER_MISS_REPORTS_PER_MINUTE": "5"},
    )  # fmt: skip
    try:
        token = httpx.post(
            f"{live.url}/v1/tokens", json={"name": "prod", "scope": "read"}, headers=AUTH
        ).json()["token"]
        prod = {"Authorization": f"Bearer {token}"}
        assert [report(live.url, m, prod).status_code for m in range(1, 6)] == [202] * 5
        limited = report(live.url, 6, prod)
        assert limited.status_code == 429
        assert "more than 5 miss reports a minute" in limited.json()["detail"]
        assert 1 <= int(limited.headers["retry-after"]) <= 12
        assert report(live.url, 1, prod).status_code == 429  # even a key already queued
        # Other callers are not held back: the admin token, and no token (by address).
        assert report(live.url, 6, AUTH).status_code == 202
        assert report(live.url, 7).status_code == 202
        assert len(jobs(live.url)) == 7  # the refused report created nothing
    finally:
        live.stop()


@pytest.fixture
def capped_server(database: tuple[str, Path | None], tmp_path: Path) -> LiveServer:
    """At most 3 new jobs from misses a minute, all of them one caller's if it asks."""
    url, path = database
    env = {"TUNECACHE_SERVER_MISS_JOBS_PER_MINUTE": "3",
           "TUNECACHE_SERVER_MISS_JOBS_CALLER_SHARE": "1"}  # fmt: skip
    live = start_server(url, path, tmp_path / "server.log", env=env)
    yield live  # type: ignore[misc]
    live.stop()


def test_misses_create_at_most_the_servers_jobs_a_minute(capped_server: LiveServer) -> None:
    url = capped_server.url
    created = [report(url, m, AUTH).json()["created"] for m in (1, 2, 3)]
    assert created == [True, True, True]
    over = report(url, 4, AUTH)
    assert over.status_code == 429 and "3 new jobs in the last minute" in over.json()["detail"]
    assert "retry-after" in over.headers
    again = report(url, 2, AUTH)  # already queued: answered, not limited
    assert again.status_code == 202 and not again.json()["created"]
    # Explicit pre-tuning jobs are not misses and are never held back by the cap.
    body = {"key": make_key(m=4).to_json()}
    assert httpx.post(f"{url}/v1/jobs", json=body, headers=AUTH).status_code == 201
    assert sorted(j["key"]["problem"]["M"] for j in jobs(url)) == [1, 2, 3, 4]


def test_a_job_queued_through_the_api_cannot_pass_for_a_miss(capped_server: LiveServer) -> None:
    """A write token queued jobs with ``"source": "miss"``: they were counted in the misses'
    server-wide budget, which that one token spent alone (65 in a minute, every other caller's
    misses then refused with 429), past its share; a miss's answer marked them done."""
    url = capped_server.url
    token = issue_token(url, "write")
    writer = {"Authorization": f"Bearer {token}"}
    for m in (1, 2, 3):
        body = {"key": make_key(m=m).to_json(), "source": "miss"}
        refused = httpx.post(f"{url}/v1/jobs", json=body, headers=writer, timeout=30)
        assert refused.status_code == 422 and "source 'miss' is the server's" in refused.text
        body["source"] = "pretune"  # any other source is the token's own
        assert httpx.post(f"{url}/v1/jobs", json=body, headers=writer).status_code == 201
    assert [report(url, m, AUTH).status_code for m in (4, 5, 6)] == [202, 202, 202]
    assert sorted(j["source"] for j in jobs(url)) == ["miss"] * 3 + ["pretune"] * 3


def test_one_caller_gets_only_its_share_of_the_new_jobs(database: tuple[str, Path | None],
                                                        tmp_path: Path) -> None:  # fmt: skip
    """One caller (here: an address, no token) spent the whole server's budget of new jobs from
    misses, and every other caller's miss was refused; now it gets its share (a quarter: 2 of
    8), counted in the database, and the others theirs."""
    url, path = database
    live = start_server(url, path, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_MISS_JOBS_PER_MINUTE": "8"})  # fmt: skip
    try:
        assert [report(live.url, m).status_code for m in (1, 2)] == [202, 202]
        over = report(live.url, 3)
        assert over.status_code == 429, over.text
        assert "its share of the server's 8" in over.json()["detail"]
        assert "retry-after" in over.headers
        again = report(live.url, 1)  # already queued: answered, not limited
        assert again.status_code == 202 and not again.json()["created"]
        token = issue_token(live.url, "read")
        other = report(live.url, 3, {"Authorization": f"Bearer {token}"})
        assert other.status_code == 202 and other.json()["created"], other.text
        assert sorted(j["key"]["problem"]["M"] for j in jobs(live.url)) == [1, 2, 3]
    finally:
        live.stop()


def test_callers_without_a_token_get_half_the_new_jobs_together(
    database: tuple[str, Path | None], tmp_path: Path
) -> None:
    """Four addresses with no token, each within its share, spent the server's whole budget of
    new jobs from misses (60 junk jobs a minute) and a consumer's miss with a token was refused:
    callers without a token now get half of it together, the callers with one the rest."""
    url, path = database
    live = start_server(url, path, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_MISS_JOBS_PER_MINUTE": "8"})  # fmt: skip

    def from_address(address: str, m: int) -> httpx.Response:
        transport = httpx.HTTPTransport(local_address=address)
        with httpx.Client(transport=transport, timeout=30) as http:
            return http.post(f"{live.url}/v1/misses", json={"key": make_key(m=m).to_json()})

    try:
        made = [from_address(f"127.0.0.{2 + i // 2}", 10 + i).status_code for i in range(4)]
        assert made == [202] * 4  # two addresses, two jobs each: their shares
        over = from_address("127.0.0.9", 20)  # a third address, within its own share
        assert over.status_code == 429, over.text
        assert "callers without a token created 4 new jobs" in over.json()["detail"]
        token = {"Authorization": f"Bearer {issue_token(live.url, 'read')}"}
        mine = report(live.url, 21, token)
        assert mine.status_code == 202 and mine.json()["created"], mine.text
        assert len(jobs(live.url)) == 5
    finally:
        live.stop()


@pytest.mark.parametrize("proxies", ["", "127.0.0.1"])
def test_a_caller_names_itself_only_through_a_trusted_proxy(proxies: str, tmp_path: Path) -> None:
    """uvicorn believed any loopback client's ``X-Forwarded-For``, so one local process was a new
    caller with each request and spent everyone's budget of new jobs. A caller is now its
    connection's address, unless the server was told to trust that address as a proxy."""
    db_path = tmp_path / "cache.db"
    env = {"TUNECACHE_SERVER_MISS_JOBS_PER_MINUTE": "8",
           "TUNECACHE_SERVER_FORWARDED_ALLOW_IPS": proxies}  # fmt: skip
    live = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log", env=env)
    try:
        forged = [report(live.url, m, {"X-Forwarded-For": f"10.0.0.{m}"}).status_code
                  for m in (1, 2, 3)]  # fmt: skip
        # Untrusted, the three are one caller and its share is 2; through a proxy, three.
        assert forged == ([202, 202, 202] if proxies else [202, 202, 429])
    finally:
        live.stop()


def test_client_reports_a_miss_once_per_miss_ttl(server: LiveServer) -> None:
    key = make_key(m=96)
    with Client(server.url, report_misses=True, miss_ttl=60, timeout=5) as client:
        first = client.lookup(key, default={"d": 1})
        second = client.lookup(key, default={"d": 1})
    assert first.source == second.source == "default"
    queued = jobs(server.url)
    assert [(j["key_hash"], j["source"]) for j in queued] == [(key.digest(), "miss")]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "tunecache_misses_reported_total 1.0" in metrics
    with Client(server.url, timeout=5) as quiet:  # reporting is opt-in
        quiet.lookup(make_key(m=97))
    assert len(jobs(server.url)) == 1


def test_a_trusted_proxy_is_written_as_uvicorn_reads_it() -> None:
    """uvicorn reads "10.0.0.1/8" (host bits set) as a name, not a network: the proxy was not
    trusted and every client behind it was one caller. The setting writes what it checked."""
    from cache_server.settings import ServerSettings

    given = ServerSettings(forwarded_allow_ips="10.0.0.1/8, ::1 ,192.168.1.7")
    assert given.forwarded_allow_ips == "10.0.0.0/8,::1,192.168.1.7"
    for wrong in ("*", "proxy.internal", "10.0.0.0/33"):
        with pytest.raises(ValueError, match="is not an IP address or network"):
            ServerSettings(forwarded_allow_ips=wrong)


LIMIT = 6  # new jobs from misses a minute: small, so that a burst of reports meets it at once


@pytest.mark.parametrize("token", [True, False], ids=["token", "no-token"])
def test_concurrent_misses_create_exactly_the_limits_jobs(
    database: tuple[str, Path | None], tmp_path: Path, token: bool
) -> None:
    """Each server process counted the last minute's jobs from misses and then inserted its
    own, and concurrent reports to two server processes (measured on PostgreSQL: 16 jobs where
    the limit was 15) each read a count below the limit. The count and the insert are now one
    serialized step: a burst of reports of distinct keys, at once, to two processes creates
    exactly the limit's jobs (the server's, with a token; half of it, without), the rest 429."""
    url, path = database
    env = {"TUNECACHE_SERVER_MISS_JOBS_PER_MINUTE": str(LIMIT),
           "TUNECACHE_SERVER_MISS_JOBS_CALLER_SHARE": "1",  # one caller's share: all of it
           "TUNECACHE_SERVER_MAX_IN_FLIGHT": "8"}  # fmt: skip
    live = start_server(url, path, tmp_path / "server.log", env=env, args=["--workers", "2"])
    reports, start = 48, threading.Barrier(48)
    # A connection each: the kernel spreads them over the two processes.
    headers = {"Connection": "close", **(AUTH if token else {})}

    def one(m: int) -> int:
        start.wait(timeout=60)
        return report(live.url, m, headers).status_code

    try:
        with ThreadPoolExecutor(reports) as pool:
            codes = list(pool.map(one, range(1, reports + 1)))
    finally:
        live.stop()
    engine = make_engine(url)
    try:
        with engine.connect() as db:
            made = db.execute(text("SELECT count(*) FROM jobs WHERE source = 'miss'")).scalar()
    finally:
        engine.dispose()
    expected = LIMIT if token else LIMIT // 2
    assert made == expected, f"{made} jobs from misses, the limit {expected}: {sorted(codes)}"
    assert codes.count(202) == expected and set(codes) <= {202, 429, 503}  # 503: shed, a busy box
