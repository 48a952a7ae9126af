"""The resolver: sources in order, every answer checked by ``fits``, never an exception."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
import pytest

from tests.factories import knobs, make_key, make_record, miss
from tunecache import Client, RecordsSource, Resolver, ServerSource
from tunecache.schemas import LookupRequest, LookupResponse, RecordPublic


def served(body: bytes, config: dict) -> bytes:  # type: ignore[type-arg]
    """The answer to the lookup ``body``: a record of the asked key holding ``config``."""
    key = LookupRequest.model_validate_json(body).key.to_key()
    record = make_record(key, config=config).model_dump(mode="json", by_alias=True)
    public = RecordPublic.model_validate(
        {**record, "id": 7, "key_hash": "0" * 64, "created_at": "2026-01-01T00:00:00Z"}
    )
    return LookupResponse(record=public).model_dump_json().encode()


def server_answering(config: dict, calls: list[int], delay: float = 0.0) -> Client:  # type: ignore[type-arg]
    """An API client over an in-memory server that answers every lookup with a record of the
    asked key holding ``config``, after ``delay`` seconds."""

    def handle(request: httpx.Request) -> httpx.Response:
        time.sleep(delay)
        calls.append(1)
        return httpx.Response(200, content=served(request.content, config))

    return Client("http://in-memory.test", transport=httpx.MockTransport(handle), token="")


def never_wide(config: dict) -> str | None:  # type: ignore[type-arg]
    return "wider than this device allows" if config.get("tile_i", 0) > 8 else None


def test_a_config_that_does_not_fit_falls_through_to_the_next_source(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []
    snapshot = RecordsSource([make_record(make_key(), config=knobs(64))])
    with server_answering(knobs(4), calls) as client:
        resolver = Resolver([snapshot, ServerSource(client)])
        first = resolver.resolve(make_key(), fits=never_wide)
        again = resolver.resolve(make_key(), fits=never_wide)
    assert (first.source, first.config, first.rule) == ("server", knobs(4), "exact")
    assert (again.source, again.config) == ("memo", knobs(4))  # remembered: one request
    assert calls == [1]
    assert [r.levelname for r in caplog.records].count("WARNING") == 1  # said once


def test_nothing_fits_means_the_default_and_nothing_raises() -> None:
    calls: list[int] = []
    with server_answering(knobs(64), calls) as client:
        resolver = Resolver([RecordsSource([]), ServerSource(client)])
        result = resolver.resolve(make_key(), default=knobs(1), fits=never_wide)
    assert (result.source, result.config, result.hit, result.rule) == ("default", knobs(1),
                                                                       False, None)  # fmt: skip


def test_a_records_source_answers_by_the_rules_without_a_server() -> None:
    resolver = Resolver([RecordsSource([make_record(make_key(m=64), config=knobs(1)),
                                        make_record(make_key(m=128), config=knobs(2),
                                                    passed=False)])])  # fmt: skip
    assert resolver.resolve(make_key(m=60)).rule == "bucket"
    assert resolver.resolve(make_key(m=128)).source == "default"  # unvalidated: never served


def test_what_a_caller_does_to_its_answer_reaches_no_other_caller() -> None:
    """A caller that takes launch options out of its config (``config.pop("num_warps")``, then
    the rest as arguments) emptied the memo's config for every later caller, unchecked, and the
    snapshot record's own. Now each caller's answer is its own, and so is what ``verify`` and
    ``fits`` are handed."""
    from tunecache.schemas import CheckModel

    record = make_record(make_key(m=64), config=knobs(2))
    snapshot = Resolver([RecordsSource([record])])
    snapshot.resolve(make_key(m=64)).config.pop("tile_i")  # type: ignore[union-attr]
    assert snapshot.resolve(make_key(m=64)).config == knobs(2) and record.config == knobs(2)

    def verify(config: dict) -> CheckModel:  # type: ignore[type-arg]
        config.clear()  # a check that changes what it was handed
        return CheckModel(problem=dict(key.problem), seed=0, rel_error=0.0, max_abs_error=0.0,
                          tolerance=1e-4, passed=True)  # fmt: skip

    def fits(config: dict) -> None:  # type: ignore[type-arg]
        config["tile_i"] = 99

    key, calls = make_key(), []
    with server_answering(knobs(4), calls) as client:
        first = client.lookup(key, verify=verify, fits=fits)
        assert (first.source, first.config) == ("server", knobs(4))
        first.config.pop("tile_i")  # type: ignore[union-attr]
        first.problem.clear()  # type: ignore[union-attr]
        again = client.lookup(key)
        assert (again.source, again.config, again.problem) == ("memo", knobs(4), key.problem)
        again.config["tile_i"] = 7  # type: ignore[index]
        assert client.lookup(key).config == knobs(4) and calls == [1]


def test_miss_reports_never_make_the_caller_wait() -> None:
    """The server answers lookups at once but takes 0.3 s per miss report: lookups return
    before any report is sent, and closing the client sends what is queued."""
    import threading
    import time

    reported: list[float] = []
    release = threading.Event()

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/misses":
            release.wait(5)
            reported.append(time.monotonic())
            return httpx.Response(202, json={"job_id": 1, "created": True})
        return miss()

    client = Client("http://in-memory.test", transport=httpx.MockTransport(handle), token="",
                    report_misses=True, timeout=5)  # fmt: skip
    started = time.monotonic()
    results = [client.lookup(make_key(m=m), default={"d": 1}) for m in (8, 16, 32)]
    took = time.monotonic() - started
    assert [r.source for r in results] == ["default"] * 3 and took < 1.0 and reported == []
    release.set()
    client.close()
    assert len(reported) == 3  # sent in the background, all of them by close()


def test_async_lookups_never_block_the_event_loop() -> None:
    """A slow server (0.3 s a lookup): the loop keeps ticking while lookups wait; the answers
    are the sync path's, and a memo hit answers without a thread."""
    import asyncio

    calls: list[int] = []
    client = server_answering(knobs(4), calls, delay=0.3)

    async def main() -> tuple[list[str], int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        results = await asyncio.gather(*(client.alookup(make_key(m=m)) for m in (8, 16)))
        again = await client.alookup(make_key(m=8))
        task.cancel()
        return [r.source for r in (*results, again)], ticks

    sources, ticks = asyncio.run(main())
    client.close()
    assert sources == ["server", "server", "memo"] and len(calls) == 2
    assert ticks >= 10  # the loop ran on while the lookups waited


def test_threads_asking_at_once_share_one_request_per_key_and_few_at_a_time() -> None:
    """32 threads looking one key up at once sent 32 requests (against a server's default of 2 in
    flight, 25 were shed and given the default config); now one, whose answer they all get, and
    at most two keys' requests at a time, the others waiting for a slot within the timeout."""
    import threading

    lock, flying, most, calls = threading.Lock(), [0], [0], []

    def handle(request: httpx.Request) -> httpx.Response:
        with lock:
            flying[0] += 1
            most[0] = max(most[0], flying[0])
        time.sleep(0.03)
        with lock:
            flying[0] -= 1
            calls.append(1)
        key = LookupRequest.model_validate_json(request.content).key.to_key()
        record = make_record(key, config=knobs(4)).model_dump(mode="json", by_alias=True)
        public = RecordPublic.model_validate(
            {**record, "id": 7, "key_hash": "0" * 64, "created_at": "2026-01-01T00:00:00Z"}
        )
        return httpx.Response(200, content=LookupResponse(record=public).model_dump_json())

    def burst(client: Client, keys: list) -> list:  # type: ignore[type-arg]
        found: list = [None] * len(keys)  # type: ignore[type-arg]

        def ask(i: int) -> None:
            found[i] = client.lookup(keys[i])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(keys))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return found

    with Client("http://in-memory.test", transport=httpx.MockTransport(handle), token="",
                timeout=5.0) as client:  # fmt: skip
        same = burst(client, [make_key(m=64)] * 32)
        assert len(calls) == 1 and all(r.config == knobs(4) for r in same)
        distinct = burst(client, [make_key(m=m) for m in range(1, 9)])
    assert all(r.source == "server" and r.config == knobs(4) for r in distinct)
    assert len(calls) == 9 and most[0] == 2


@pytest.mark.parametrize("passes", [True, False])
def test_threads_verifying_one_served_config_run_one_check(passes: bool) -> None:
    """16 threads with ``verify`` ran 16 checks of one config (16 disputes when it failed), and a
    caller that did not verify put the failed config back in the memo, for good. Now one check;
    the others wait for it; a config that failed here is never used in this process."""
    import threading

    from tunecache.schemas import CheckModel

    checks: list[int] = []

    def verify(config: dict) -> CheckModel:  # type: ignore[type-arg]
        checks.append(1)
        time.sleep(0.1)
        if passes:
            return CheckModel(problem=dict(key.problem), seed=0, rel_error=0.0, max_abs_error=0.0,
                              tolerance=1e-4, passed=True)  # fmt: skip
        return CheckModel.raised(key.problem, 0, "wrong answer")

    key, calls = make_key(), []
    with server_answering(knobs(4), calls) as client:
        results: list = []  # type: ignore[type-arg]
        threads = [threading.Thread(target=lambda: results.append(
            client.lookup(key, default=knobs(1), verify=verify))) for _ in range(16)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        unverified = client.resolver.resolve(key, default=knobs(1))
    assert len(checks) == 1 and len(results) == 16
    expected = knobs(4) if passes else knobs(1)
    assert all(r.config == expected for r in results) and unverified.config == expected


def test_many_async_lookups_stay_within_their_bound_and_leave_the_loops_executor_alone() -> None:
    """64 tasks' lookups ran in the event loop's default executor (6 threads here): they took
    3.9 s of a 0.5 s timeout, and other work there waited as long. Now the resolver's own
    threads, and each task's answer within twice the lookup timeout (the default after)."""
    import asyncio

    calls: list[int] = []
    with server_answering(knobs(4), calls, delay=0.3) as client:

        async def burst() -> tuple[list[float], float]:
            loop = asyncio.get_running_loop()

            async def timed(m: int) -> float:
                started = time.monotonic()
                await client.alookup(make_key(m=m))
                return time.monotonic() - started

            tasks = [asyncio.create_task(timed(m)) for m in range(1, 65)]
            await asyncio.sleep(0.05)
            started = time.monotonic()
            await loop.run_in_executor(None, time.sleep, 0)  # other work for the default pool
            other = time.monotonic() - started
            return list(await asyncio.gather(*tasks)), other

        took, other = asyncio.run(burst())
    assert max(took) < 2 * client.timeout.lookup + 0.3, max(took)
    assert other < 0.2 and calls  # the server was asked; the loop's executor never waited


def test_a_check_that_looks_its_own_key_up_does_not_hang_and_a_closed_client_answers() -> None:
    """One check per config is a lock held while it runs: a check that looked its own key up
    (a reference that launches the tuned kernel) waited for itself for good. And ``alookup``
    after ``close()`` raised (no thread would take it); now the default."""
    import asyncio
    import threading

    from tunecache.schemas import CheckModel

    key, calls, depth = make_key(), [], []
    with server_answering(knobs(4), calls) as client:

        def verify(config: dict) -> CheckModel:  # type: ignore[type-arg]
            depth.append(1)
            if len(depth) == 1:  # once: the lookup inside the check, checked too
                client.lookup(key, default=knobs(1), verify=verify)
            return CheckModel(problem=dict(key.problem), seed=0, rel_error=0.0,
                              max_abs_error=0.0, tolerance=1e-4, passed=True)  # fmt: skip

        found: list = []  # type: ignore[type-arg]
        thread = threading.Thread(target=lambda: found.append(
            client.lookup(key, default=knobs(1), verify=verify)), daemon=True)  # fmt: skip
        thread.start()
        thread.join(10)
        assert not thread.is_alive() and found[0].config == knobs(4)
        asyncio.run(client.alookup(make_key(m=8)))  # the resolver's threads exist
    after = asyncio.run(client.alookup(make_key(m=16), default=knobs(1)))
    assert (after.source, after.config) == ("default", knobs(1))


def test_closing_waits_for_the_lookups_at_the_server_and_blames_it_for_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``close()`` while a lookup was at the server closed the connection under it: the lookup
    failed (``ReadError: Bad file descriptor``), its caller got the default, and the server was
    logged as failing. Now closing waits for it (within its timeout), and a lookup asked after
    the close answers without the server."""
    import threading

    from tests import hostile

    def slow_hit(conn: Any, request: hostile.Request, seen: hostile.Seen) -> None:
        time.sleep(0.4)
        hostile.answer(conn, 200, served(request.body, knobs(4)))

    found: list[Any] = []
    with hostile.serve(slow_hit) as (url, seen):
        client = Client(url, timeout=5.0, token="")
        asking = threading.Thread(target=lambda: found.append(client.lookup(make_key(m=64))))
        asking.start()
        time.sleep(0.1)  # at the server
        client.close()
        asking.join()
        after = client.lookup(make_key(m=128), default={"tile": 1})
    assert (found[0].source, found[0].config) == ("server", knobs(4))
    assert (after.source, after.config) == ("default", {"tile": 1})
    assert seen.requests == ["POST /v1/lookup"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
