"""One storage contract, run against a real server on SQLite and on PostgreSQL.

Every test here runs twice (the ``database`` fixture's params): the server code path is the same;
only the database differs.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, make_key, make_record
from tunecache.key import Key

pytestmark = pytest.mark.slow


def upload(http: httpx.Client, key: Key, ms: float, *, passed: bool = True, trials: int = 2) -> int:
    body = make_record(key, time_ms=ms, passed=passed, trials=trials).model_dump(
        mode="json", by_alias=True
    )
    response = http.post("/v1/records", json=body)
    assert response.status_code == 201, response.text
    record_id: int = response.json()["record_id"]
    return record_id


def winner(http: httpx.Client, key: Key) -> dict | None:  # type: ignore[type-arg]
    response = http.post("/v1/lookup", json={"key": key.to_json()})
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    record: dict = response.json()["record"]  # type: ignore[type-arg]
    return record


class TestStorageContract:
    def test_keep_the_fastest_validated_and_every_trial(self, any_server: LiveServer) -> None:
        key = make_key(m=77)
        with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
            assert winner(http, key) is None
            ids = {ms: upload(http, key, ms) for ms in (3.0, 1.5, 2.0)}
            upload(http, key, 0.1, passed=False)  # faster but wrong: never served
            record = winner(http, key)
            assert record is not None and record["id"] == ids[1.5]
            full = http.get(f"/v1/records/{ids[2.0]}").json()
            assert [t["status"] for t in full["trials"]] == ["ok", "compile_error"]
            assert http.get("/health").json()["records"] == 4

    def test_list_filters(self, any_server: LiveServer) -> None:
        with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
            upload(http, make_key(m=8, kernel="softmax"), 1.0)
            upload(http, make_key(m=8, backend="inductor"), 1.0)
            upload(http, make_key(m=16), 1.0, passed=False)
            page = http.get("/v1/records", params={"kernel": "matmul", "validated": "true"}).json()
            assert [r["key"]["backend"] for r in page["items"]] == ["inductor"]
            assert http.get("/v1/records", params={"winners_only": "true"}).json()["count"] == 2

    def test_concurrent_writers_lose_nothing(self, any_server: LiveServer) -> None:
        """16 writers x 200 uploads over shared and distinct keys."""
        writers, per_writer, trials_each = 16, 200, 2
        shared = [make_key(m=m) for m in (1, 2, 3, 4)]
        rng = random.Random(7)
        plan: list[list[tuple[Key, float, bool]]] = []
        for w in range(writers):
            own = make_key(m=1000 + w)
            plan.append([
                (rng.choice(shared) if rng.random() < 0.7 else own,
                 round(rng.uniform(0.01, 10.0), 6), rng.random() < 0.9)
                for _ in range(per_writer)
            ])  # fmt: skip

        def write(jobs: list[tuple[Key, float, bool]]) -> int:
            with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=120) as http:
                for key, ms, passed in jobs:
                    upload(http, key, ms, passed=passed, trials=trials_each)
            return len(jobs)

        with ThreadPoolExecutor(writers) as pool:
            assert sum(pool.map(write, plan)) == writers * per_writer
        expected: dict[str, float] = {}
        for jobs in plan:
            for key, ms, passed in jobs:
                if passed:
                    digest = key.digest()
                    expected[digest] = min(ms, expected.get(digest, float("inf")))
        with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
            keys = {k.digest(): k for jobs in plan for k, _, _ in jobs}
            for digest, fastest in expected.items():
                record = winner(http, keys[digest])
                assert record is not None and record["timing"]["median_ms"] == fastest
            assert http.get("/health").json()["records"] == writers * per_writer
            for record_id in random.Random(1).sample(range(1, writers * per_writer + 1), 25):
                full = http.get(f"/v1/records/{record_id}").json()
                assert len(full["trials"]) == trials_each  # no trial lost

    def test_one_record_sent_at_once_on_many_connections_is_stored_once(
        self, any_server: LiveServer
    ) -> None:
        """A sender that timed out sends again while its first sending is still being stored:
        the same token's same record, on 8 connections at once, is one record; one answer is a
        201 and the others a 200 naming it, never a 5xx."""
        senders = 8
        for m in range(5):
            body = make_record(make_key(m=300 + m)).model_dump(mode="json", by_alias=True)
            start = threading.Barrier(senders)

            def send(_: int, body: dict = body, start: threading.Barrier = start) -> httpx.Response:  # type: ignore[type-arg]
                with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=60) as http:
                    start.wait()
                    return http.post("/v1/records", json=body)

            with ThreadPoolExecutor(senders) as pool:
                answers = list(pool.map(send, range(senders)))
            assert sorted(a.status_code for a in answers) == [200] * (senders - 1) + [201]
            assert len({a.json()["record_id"] for a in answers}) == 1
        with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
            assert http.get("/health").json()["records"] == 5


def test_acknowledged_uploads_survive_kill_9(
    database: tuple[str, Path | None], tmp_path: Path
) -> None:
    url, path = database
    log = tmp_path / "server.log"
    live = start_server(url, path, log)
    acknowledged: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def write(worker: int) -> None:
        with httpx.Client(headers=AUTH, base_url=live.url, timeout=10) as http:
            n = 0
            while not stop.is_set():
                n += 1
                body = make_record(make_key(m=1 + (worker * 10_000 + n) % 50), time_ms=n % 7 + 1.0)
                try:
                    response = http.post(
                        "/v1/records", json=body.model_dump(mode="json", by_alias=True)
                    )
                except httpx.HTTPError:
                    return  # the server is gone
                if response.status_code == 201:
                    with lock:
                        acknowledged.append(response.json()["record_id"])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(acknowledged) < 150 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(live.process.pid, signal.SIGKILL)  # mid-traffic, no shutdown
    live.process.wait(timeout=10)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert len(acknowledged) >= 150
    again = start_server(url, path, log)
    try:
        with httpx.Client(headers=AUTH, base_url=again.url, timeout=30) as http:
            for record_id in acknowledged:
                assert http.get(f"/v1/records/{record_id}").status_code == 200, record_id
            assert http.get("/health").json()["records"] >= len(acknowledged)
    finally:
        again.stop()


@pytest.mark.parametrize(
    "path",
    [("key", "device", "name"), ("config_summary",), ("trials", 0, "error"), ("config", "x")],
)
def test_nul_characters_are_422_not_500(any_server: LiveServer, path: tuple) -> None:  # type: ignore[type-arg]
    body = make_record(make_key(m=5)).model_dump(mode="json", by_alias=True)
    target = body
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = "bad\x00value"
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        response = http.post("/v1/records", json=body)
        assert response.status_code == 422, response.text
        assert "NUL" in response.text
        assert http.get("/health").json()["records"] == 0


# Every string a route filters on, the API's and the dashboard's.
QUERY_FILTERS = [("/v1/records", "kernel"), ("/v1/records", "dtype"), ("/v1/records", "device_arch"),
                 ("/", "kernel"), ("/", "backend"), ("/", "device_arch"), ("/ui/jobs", "state")]  # fmt: skip


def test_a_nul_in_a_query_filter_is_422_naming_it(any_server: LiveServer) -> None:
    """PostgreSQL's text cannot hold a NUL: a filter with one reached the database and was a 500
    (DataError), for anyone (reads are open). Each is validated as the API's filters are."""
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as writer:
        upload(writer, make_key(), 1.0)
    with httpx.Client(base_url=any_server.url, timeout=30) as http:
        for path, name in QUERY_FILTERS:
            answer = http.get(path, params={name: "a\x00b"})
            assert answer.status_code == 422, (path, name, answer.text)
            if path.startswith("/v1/"):
                assert answer.json()["errors"][0]["loc"] == ["query", name], answer.text
            else:  # a page says it in HTML
                assert f"query.{name}" in answer.text, answer.text
        # The dashboard's form sends "" for "any": still every record, every job.
        page = http.get("/", params={"kernel": "", "backend": "", "device_arch": ""})
        assert page.status_code == 200 and "matmul" in page.text
        assert http.get("/ui/jobs", params={"state": ""}).status_code == 200
        listed = http.get("/v1/records", params={"kernel": "matmul", "dtype": "float32",
                                                 "device_arch": "cpu-avx2"})  # fmt: skip
        assert listed.json()["count"] == 1
