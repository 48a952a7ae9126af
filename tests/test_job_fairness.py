"""One write token cannot take the job queue: its open jobs are capped, its priority and attempts
bounded, claims at one priority shared among requesters, and another's failed job re-queued with
that job's own parameters. Through a real server, on SQLite and PostgreSQL.

The audit: one write token sent 500 ``POST /v1/jobs`` in 1.9 s (priority 1000, a million trials,
100 attempts each) and a daemon claimed nothing else for as long as it ran."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, database_server
from tests.factories import AUTH, issue_token, make_key

pytestmark = pytest.mark.slow


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _create(url: str, headers: dict[str, str], m: int, **fields: object) -> httpx.Response:
    body = {"key": make_key(m=m).to_json(), **fields}
    return httpx.post(f"{url}/v1/jobs", json=body, headers=headers, timeout=30)


def _claim(url: str, worker: str) -> dict | None:
    answer = httpx.post(f"{url}/v1/jobs/claim", json={"worker": worker, "lease_seconds": 600},
                        headers=AUTH, timeout=30)  # fmt: skip
    if answer.status_code == 204:
        return None
    assert answer.status_code == 200, answer.text
    job: dict = answer.json()
    return job


@pytest.fixture
def capped(database: tuple[str, Path | None], tmp_path: Path) -> Iterator[LiveServer]:
    """A server whose tokens may each have 3 open jobs."""
    yield from database_server(database, tmp_path, {"TUNECACHE_SERVER_JOBS_OPEN_PER_TOKEN": "3"})


def test_a_tokens_open_jobs_are_capped(capped: LiveServer) -> None:
    """Past the cap a new job is a 429 naming the cap and its setting (concurrent requests
    included); a key already queued is still answered; another token and an admin are not
    held by it."""
    url = capped.url
    mallory = _headers(issue_token(url, "write"))
    answers: list[int] = []

    def send(m: int) -> None:
        answers.append(_create(url, mallory, m).status_code)

    threads = [threading.Thread(target=send, args=(m,)) for m in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [201] * 3 + [429] * 5
    refused = _create(url, mallory, 100)
    assert refused.status_code == 429
    assert "3 open" in refused.json()["detail"]
    assert "TUNECACHE_SERVER_JOBS_OPEN_PER_TOKEN" in refused.json()["detail"]
    assert int(refused.headers["Retry-After"]) >= 1
    queued = httpx.get(f"{url}/v1/jobs", params={"state": "queued"}, timeout=30).json()["items"]
    mine = sorted(job["key"]["problem"]["M"] for job in queued)
    assert _create(url, mallory, mine[0]).status_code == 200  # already queued: answered
    alice = _headers(issue_token(url, "write"))
    assert _create(url, alice, 200).status_code == 201
    assert all(_create(url, AUTH, m).status_code == 201 for m in range(300, 305))


def test_a_finished_job_makes_room_under_the_cap(capped: LiveServer) -> None:
    """A job that failed (or is done) is no longer open: the token may queue another."""
    url = capped.url
    mallory = _headers(issue_token(url, "write"))
    for m in (1, 2, 3):
        assert _create(url, mallory, m, max_attempts=1).status_code == 201
    assert _create(url, mallory, 4).status_code == 429
    job = _claim(url, "w")
    assert job is not None
    failed = httpx.post(f"{url}/v1/jobs/{job['id']}/fail", json={"worker": "w", "error": "x"},
                        headers=AUTH, timeout=30)  # fmt: skip
    assert failed.json()["state"] == "failed"
    assert _create(url, mallory, 4).status_code == 201


def test_a_write_tokens_priority_and_attempts_are_lowered(any_server: LiveServer) -> None:
    """A write token's priority 1000 and 100 attempts are lowered to the server's bounds
    (0 and 5 by default); what clients send by default is kept; an admin's are not bounded."""
    url = any_server.url
    mallory = _headers(issue_token(url, "write"))
    flood = _create(url, mallory, 1, priority=1000, max_attempts=100, trials=1_000_000)
    assert flood.status_code == 201, flood.text
    job = flood.json()["job"]
    assert (job["priority"], job["max_attempts"], job["trials"]) == (0, 5, 1_000_000)
    plain = _create(url, mallory, 2, priority=-5, max_attempts=3).json()["job"]
    assert (plain["priority"], plain["max_attempts"]) == (-5, 3)
    admin = _create(url, AUTH, 3, priority=1000, max_attempts=100).json()["job"]
    assert (admin["priority"], admin["max_attempts"]) == (1000, 100)


def test_a_flood_at_one_priority_waits_behind_everyone_elses_jobs(any_server: LiveServer) -> None:
    """Mallory queues six jobs, then Alice two, all at one priority: Alice's come first (the
    requester with fewer open jobs first, then the oldest job), where Mallory's six were
    taken first. A higher priority still comes first."""
    url = any_server.url
    mallory = _headers(issue_token(url, "write"))
    alice = _headers(issue_token(url, "write"))
    owner = {}
    for m in range(1, 7):
        owner[_create(url, mallory, m).json()["job"]["id"]] = "mallory"
    for m in (11, 12):
        owner[_create(url, alice, m).json()["job"]["id"]] = "alice"
    urgent = _create(url, AUTH, 20, priority=10).json()["job"]["id"]
    owner[urgent] = "admin"
    order = []
    for i in range(5):
        job = _claim(url, f"w{i}")
        assert job is not None
        order.append(owner[job["id"]])
    assert order == ["admin", "alice", "alice", "mallory", "mallory"]


def test_a_daemon_that_finishes_each_job_first_still_takes_the_floods_last(
    any_server: LiveServer,
) -> None:
    """One daemon claims a job, ends it, claims the next: no job is running at any claim, and
    counting running jobs alone took Mallory's flood first, every time."""
    url = any_server.url
    mallory = _headers(issue_token(url, "write"))
    alice = _headers(issue_token(url, "write"))
    owner = {}
    for m in range(1, 5):
        owner[_create(url, mallory, m, max_attempts=1).json()["job"]["id"]] = "mallory"
    for m in (11, 12):
        owner[_create(url, alice, m, max_attempts=1).json()["job"]["id"]] = "alice"
    order = []
    while (job := _claim(url, "w")) is not None:
        order.append(owner[job["id"]])
        ended = httpx.post(f"{url}/v1/jobs/{job['id']}/fail", json={"worker": "w", "error": "x"},
                           headers=AUTH, timeout=30)  # fmt: skip
        assert ended.json()["state"] == "failed"
    assert order == ["alice", "alice", "mallory", "mallory", "mallory", "mallory"]


def test_misses_are_a_requester_of_their_own(any_server: LiveServer) -> None:
    """Misses (one caller's) and a token's jobs at one priority: the side with fewer open jobs
    comes first."""
    url = any_server.url
    mallory = _headers(issue_token(url, "write"))
    for m in (1, 2, 3):
        assert _create(url, mallory, m, priority=-10).status_code == 201
    for m in (4, 5):
        miss = httpx.post(f"{url}/v1/misses", json={"key": make_key(m=m).to_json()}, timeout=30)
        assert miss.status_code == 202 and miss.json()["job"]["priority"] == -10
    got = [_claim(url, f"w{i}") for i in range(4)]
    assert [job["key"]["problem"]["M"] for job in got if job] == [4, 5, 1, 2]


def test_another_tokens_failed_job_is_requeued_with_its_own_parameters(
    any_server: LiveServer,
) -> None:
    """Asking again for Alice's failed job, Mallory queues it with Alice's attempts, priority,
    strategy and budget, not her own; the job re-opened is Mallory's then (counted among her
    open jobs, under her cap), so Mallory's next request sets them, within the bounds, and
    Alice's does not (it re-opens it as hers, as it was)."""
    url = any_server.url
    mallory = _headers(issue_token(url, "write"))
    alice = _headers(issue_token(url, "write"))

    def fail_it() -> dict:
        job = _claim(url, "w")
        assert job is not None
        answer = httpx.post(f"{url}/v1/jobs/{job['id']}/fail", json={"worker": "w", "error": "x"},
                            headers=AUTH, timeout=30).json()  # fmt: skip
        assert answer["state"] == "failed"
        failed: dict = answer
        return failed

    made = _create(url, alice, 7, priority=-3, max_attempts=1, strategy="random", trials=5)
    assert made.status_code == 201, made.text
    fail_it()
    again = _create(url, mallory, 7, priority=1000, max_attempts=100, strategy="exhaustive",
                    trials=1_000_000)  # fmt: skip
    assert again.status_code == 200, again.text
    job = again.json()["job"]
    assert (job["state"], job["attempts"]) == ("queued", 0)
    got = (job["priority"], job["max_attempts"], job["strategy"], job["trials"])
    assert got == (-3, 1, "random", 5)
    fail_it()
    own = _create(url, mallory, 7, max_attempts=1, strategy="exhaustive", trials=9).json()["job"]
    got5 = (own["state"], own["priority"], own["max_attempts"], own["strategy"], own["trials"])
    assert got5 == ("queued", 0, 1, "exhaustive", 9)  # hers now: her request, within bounds
    fail_it()
    hers = _create(url, alice, 7, max_attempts=3, strategy="random", trials=4).json()["job"]
    assert (hers["max_attempts"], hers["strategy"], hers["trials"]) == (1, "exhaustive", 9)


def test_misses_and_re_queued_jobs_count_under_the_callers_cap(capped: LiveServer) -> None:
    """A token's misses opened jobs past its cap (7 open under a cap of 2, a read token's
    too), and re-queuing another token's failed job left it that token's, past its cap."""
    url = capped.url
    reader = _headers(issue_token(url, "read"))
    for m in (1, 2, 3):
        miss = httpx.post(f"{url}/v1/misses", json={"key": make_key(m=m).to_json()},
                          headers=reader, timeout=30)  # fmt: skip
        assert miss.status_code == 202, miss.text
    refused = httpx.post(f"{url}/v1/misses", json={"key": make_key(m=4).to_json()},
                         headers=reader, timeout=30)  # fmt: skip
    assert refused.status_code == 429 and "3 open" in refused.json()["detail"], refused.text
    queued = httpx.post(f"{url}/v1/misses", json={"key": make_key(m=1).to_json()},
                        headers=reader, timeout=30)  # fmt: skip
    assert queued.status_code == 202  # a key already queued is answered, past the cap too
    # Alice fails a job of hers, fills her cap; Mallory's asking again opens it as Mallory's
    alice, mallory = (_headers(issue_token(url, "write")) for _ in range(2))
    assert _create(url, alice, 10, max_attempts=1).status_code == 201
    mine = [j for j in (_claim(url, f"w{i}") for i in range(4)) if j]
    (job,) = [j for j in mine if j["key"]["problem"]["M"] == 10]
    httpx.post(f"{url}/v1/jobs/{job['id']}/fail", json={"worker": f"w{mine.index(job)}",
               "error": "x"}, headers=AUTH, timeout=30).raise_for_status()  # fmt: skip
    assert [_create(url, alice, m).status_code for m in (11, 12, 13, 14)] == [201] * 3 + [429]
    assert _create(url, mallory, 10).status_code == 200
    assert _create(url, alice, 15).status_code == 429  # still 3: the re-opened job is not hers
    assert [_create(url, mallory, m).status_code for m in (16, 17, 18)] == [201, 201, 429]


def test_a_failed_job_of_no_recorded_requester_comes_back_within_the_bounds(
    database: tuple[str, Path | None],
) -> None:
    """A flood's job queued before requesters were recorded (priority 1000, 100 attempts, then
    failed): asked for again by a write token, it came back at priority 1000 with 100 fresh
    attempts; now at the bounds a write token's own jobs get."""
    from sqlalchemy import update

    from cache_server import jobs
    from cache_server.db import make_sessionmaker
    from cache_server.migrate import prepare
    from cache_server.models import JobRow

    engine = prepare(database[0])
    key = make_key(m=77)
    try:
        with make_sessionmaker(engine).begin() as session:
            jobs.enqueue(session, key, priority=1000,
                         max_attempts=100, trials=1_000_000)  # fmt: skip
            session.execute(update(JobRow).values(state="failed", attempts=100))
        with make_sessionmaker(engine).begin() as session:
            queued = jobs.requeue_failed(session, key_hash=key.digest(), max_attempts=3,
                                         priority=0, strategy=None, trials=None,
                                         requester="token:9", caps=(0, 5))  # fmt: skip
        with make_sessionmaker(engine).begin() as session:
            job = jobs.find(session, key_hash=key.digest())
            assert job is not None and queued == 1
            got = (job.state, job.attempts, job.priority, job.max_attempts, job.trials)
        assert got == ("queued", 0, 0, 5, 1_000_000)
    finally:
        engine.dispose()


def test_a_claim_whose_fairest_job_is_held_takes_the_next_fairest_not_the_flood(
    database: tuple[str, Path | None],
) -> None:
    """Concurrent claimers all reach for the fairest requester's job: those that found it held
    (``SKIP LOCKED``) fell back to the oldest job, the flood's. They try the next fairest
    requesters first. Row locks are PostgreSQL's (SQLite runs one claim at a time)."""
    from sqlalchemy import select

    from cache_server import jobs, tokens
    from cache_server.db import make_sessionmaker
    from cache_server.migrate import prepare
    from cache_server.models import JobRow

    url, _ = database
    if not url.startswith("postgresql"):
        pytest.skip("row locks held by another claim: PostgreSQL's")
    engine = prepare(url)
    sessions = make_sessionmaker(engine)
    try:
        with sessions.begin() as session:
            _, worker = tokens.issue(session, name="daemon", scope="write")
            for m, requester in [*((m, "token:100") for m in range(1, 6)),
                                 (11, "token:101"), (12, "token:102")]:  # fmt: skip
                key = make_key(m=m)
                jobs.enqueue(session, key,
                             requested_by=requester)  # fmt: skip
            worker_id, worker_name = worker.id, worker.name
        holder = sessions()  # another claim, holding the fairest requester's only job
        held = select(JobRow).where(JobRow.requested_by == "token:101").with_for_update()
        assert holder.execute(held).scalar_one().requested_by == "token:101"
        try:
            with sessions.begin() as session:
                taken = jobs.claim(session, worker="w", token_id=worker_id,
                                   token_name=worker_name, lease_seconds=60)  # fmt: skip
                got = None if taken is None else taken.requested_by
        finally:
            holder.rollback()
            holder.close()
        assert got == "token:102"
    finally:
        engine.dispose()
