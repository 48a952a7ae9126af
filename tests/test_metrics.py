"""Observability: /metrics from a real server on SQLite and PostgreSQL, request ids, JSON logs."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from cache_server.embedded import EmbeddedServer
from cache_server.logs import JsonFormatter, request_id
from cache_server.metrics import Metrics
from cache_server.metrics_multiprocess import ENV, worker_metrics_dir
from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, make_key, make_record
from tunecache.key import Key

Labels = frozenset[tuple[str, str]]


class Scrape:
    """One parsed /metrics answer: every sample by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: dict[tuple[str, Labels], float] = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in self.families.values()
            for s in family.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(labels)[label] for sample, labels in self.samples if sample == name}


def scrape(http: httpx.Client) -> Scrape:
    response = http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return Scrape(response.text)


def body_of(key: Key, **fields: Any) -> dict[str, Any]:
    return make_record(key, **fields).model_dump(mode="json", by_alias=True)


def post_ok(http: httpx.Client, path: str, body: object, status: int) -> dict[str, Any]:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    result: dict[str, Any] = response.json()
    return result


def test_records_are_counted_by_status(any_server: LiveServer) -> None:
    """``tunecache_records`` counted every record alike: a verifier backlog (pending records
    under the verified policy, disputes waiting) could not be alerted on. A record that failed
    its validation is counted apart: no verifier takes it, and it would hold the alert up."""
    from tunecache.client import Client
    from tunecache.schemas import CheckModel
    from tunecache.verification import DisputeCreate

    url = any_server.url
    answer = httpx.post(f"{url}/v1/tokens", headers=AUTH,
                        json={"name": "ci", "scope": "write", "trusted": True})  # fmt: skip
    assert answer.status_code == 201, answer.text
    keys = [make_key(m=m) for m in (8, 16, 24)]
    with Client(url) as client:
        ids = [client.upload(make_record(key)).record_id for key in keys]
        check = CheckModel(problem=dict(keys[0].problem), seed=1, rel_error=0.5,
                           max_abs_error=1.0, tolerance=1e-4, passed=False)  # fmt: skip
        client.dispute(ids[0], DisputeCreate(problem=dict(keys[0].problem), check=check))
        client.upload(make_record(make_key(m=40), passed=False))  # no verifier ever takes it
    with Client(url, token=answer.json()["token"]) as trusted:
        trusted.upload(make_record(make_key(m=32)))  # verified on its word
    with httpx.Client(base_url=url, timeout=30) as http:
        scraped = scrape(http)
    counts = {status: scraped.value("tunecache_records_by_status", status=status)
              for status in ("pending", "verified", "disputed", "rejected", "unvalidated")}  # fmt: skip
    assert counts == {"pending": 2, "verified": 1, "disputed": 1, "rejected": 0, "unvalidated": 1}
    assert scraped.value("tunecache_records") == 5


@pytest.mark.slow
def test_metrics_count_what_the_server_did(any_server: LiveServer) -> None:
    k1, k2, k3 = make_key(m=1), make_key(m=2), make_key(m=3)
    with httpx.Client(base_url=any_server.url, timeout=30, headers=AUTH) as http:
        # Uploads: a winner, a slower validated one (kept), an unvalidated one.
        won = post_ok(http, "/v1/records", body_of(k1, time_ms=1.0), 201)
        kept = post_ok(http, "/v1/records", body_of(k1, time_ms=2.0), 201)
        unvalidated = post_ok(http, "/v1/records", body_of(k2, passed=False), 201)
        assert won["is_winner"] and not kept["is_winner"] and not unvalidated["is_winner"]
        # Lookups: two hits, two misses (k2 has no validated record, k3 nothing at all).
        for key, status in ((k1, 200), (k1, 200), (k2, 404), (k3, 404)):
            assert http.post("/v1/lookup", json={"key": key.to_json()}).status_code == status
        # Two misses reported: queued jobs at the back of the queue.
        for key in (k2, k3):
            post_ok(http, "/v1/misses", {"key": key.to_json()}, 202)
        # Three jobs: one fails for good, one is done, one stays running.
        doomed = post_ok(http, "/v1/jobs", {"key": make_key(m=4).to_json(), "priority": 5,
                                            "max_attempts": 1}, 201)["job"]  # fmt: skip
        done = post_ok(http, "/v1/jobs", {"key": k1.to_json()}, 201)["job"]  # answered by `won`
        running = post_ok(http, "/v1/jobs", {"key": make_key(m=6).to_json()}, 201)["job"]
        worker = {"worker": "w1"}
        for job, action in ((doomed, "fail"), (done, "complete"), (running, None)):
            assert post_ok(http, "/v1/jobs/claim", worker, 200)["id"] == job["id"]
            if action is not None:
                post_ok(http, f"/v1/jobs/{job['id']}/{action}",
                        {**worker, "record_id": won["record_id"]}, 200)  # fmt: skip
        # Routes with a path parameter, no route at all, and one of Starlette's own.
        assert http.get(f"/v1/records/{won['record_id']}").status_code == 200
        assert http.get("/v1/records/999999").status_code == 404
        assert http.get("/no/such/route").status_code == 404
        assert "/metrics" not in http.get("/openapi.json").json()["paths"]

        first = scrape(http)
        second = scrape(http)

    lookups = "tunecache_lookups_total"
    assert first.value(lookups, result="hit", rule="exact") == 2
    assert first.value(lookups, result="miss", rule="none") == 2
    uploads = "tunecache_uploads_total"
    assert first.value(uploads, outcome="winner") == 1
    assert first.value(uploads, outcome="kept") == 1
    assert first.value(uploads, outcome="unvalidated") == 1
    assert first.value("tunecache_misses_reported_total") == 2
    assert {state: first.value("tunecache_jobs", state=state)
            for state in ("queued", "running", "done", "failed")} == {
        "queued": 2, "running": 1, "done": 1, "failed": 1}  # fmt: skip
    assert first.value("tunecache_records") == 3

    requests = "tunecache_http_requests_total"
    expected = {  # (method, route): {status: count}
        ("POST", "/v1/records"): {"201": 3},
        ("POST", "/v1/lookup"): {"200": 2, "404": 2},
        ("POST", "/v1/misses"): {"202": 2},
        ("POST", "/v1/jobs"): {"201": 3},
        ("POST", "/v1/jobs/claim"): {"200": 3},
        ("POST", "/v1/jobs/{job_id}/fail"): {"200": 1},
        ("POST", "/v1/jobs/{job_id}/complete"): {"200": 1},
        ("GET", "/v1/records/{record_id}"): {"200": 1, "404": 1},
        ("GET", "unmatched"): {"404": 1},
        ("GET", "/openapi.json"): {"200": 1},
    }
    for (method, route), counts in expected.items():
        for code, count in counts.items():
            assert first.value(requests, method=method, route=route, status=code) == count, route
    # Templates only: no raw paths such as /v1/records/1 (and /health from start-up polling).
    routes = {route for _, route in expected} | {"/health"}
    assert first.label_values(requests, "route") == routes
    assert second.label_values(requests, "route") == routes | {"/metrics"}
    assert first.value(requests, method="GET", route="/metrics", status="200") is None
    assert second.value(requests, method="GET", route="/metrics", status="200") == 1

    duration = "tunecache_http_request_duration_seconds"
    lookup = {"method": "POST", "route": "/v1/lookup"}
    assert first.value(f"{duration}_count", **lookup) == 4
    assert first.value(f"{duration}_bucket", **lookup, le="+Inf") == 4
    assert (first.value(f"{duration}_sum", **lookup) or 0) > 0
    assert first.value(f"{duration}_bucket", **lookup, le="0.0005") is not None
    assert first.value(f"{duration}_bucket", **lookup, le="10.0") is not None


@pytest.mark.slow
def test_request_ids_are_echoed_or_replaced(server: LiveServer) -> None:
    header = "X-Request-ID"
    generated = re.compile(r"[0-9a-f]{32}")
    with httpx.Client(base_url=server.url, timeout=10) as http:
        kept = http.get("/health", headers={header: "client-42.retry_1"})
        assert kept.headers[header] == "client-42.retry_1"
        for bad in ("has space", "x" * 65, "semi;colon", "é"):
            replaced = http.get("/health", headers=[(header.encode(), bad.encode())])
            assert generated.fullmatch(replaced.headers[header]), bad
        fresh = {http.get("/health").headers[header] for _ in range(2)}
        missing = http.get("/v1/records/999999")  # error answers carry it too
    assert len(fresh) == 2 and all(generated.fullmatch(rid) for rid in fresh)
    assert generated.fullmatch(missing.headers[header])
    assert len(missing.headers.get_list(header)) == 1


def test_json_formatter_writes_one_object_a_line_with_extras() -> None:
    formatter = JsonFormatter()
    logger = logging.getLogger("tests.json")
    record = logger.makeRecord(
        "tests.json", logging.WARNING, __file__, 1, "two\nlines %s", ("here",), None,
        extra={"duration_ms": 1.5, "route": "/v1/lookup", "odd": object()},
    )  # fmt: skip
    line = formatter.format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "WARNING" and entry["logger"] == "tests.json"
    assert entry["message"] == "two\nlines here"
    assert entry["duration_ms"] == 1.5 and entry["route"] == "/v1/lookup"
    assert entry["odd"].startswith("<object object")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
    assert "request_id" not in entry and "args" not in entry and "exception" not in entry

    try:
        raise ValueError("boom")
    except ValueError:
        failed = logger.makeRecord("tests.json", logging.ERROR, __file__, 2, "failed", (),
                                   sys.exc_info())  # fmt: skip
    token = request_id.set("req-1")  # as while a request is served
    try:
        in_request = json.loads(formatter.format(failed))
    finally:
        request_id.reset(token)
    assert in_request["request_id"] == "req-1"
    assert "ValueError: boom" in in_request["exception"]


def test_access_log_has_one_line_per_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cache_server.access")
    with (
        EmbeddedServer(f"sqlite:///{tmp_path / 'cache.db'}") as live,
        httpx.Client(base_url=live.url, timeout=10) as http,
    ):
        answers = [
            http.get("/health", headers={"X-Request-ID": "first"}),
            http.get("/v1/records/7"),
            http.post("/v1/lookup", json={"key": make_key().to_json()}),
        ]
    # The server has stopped: every request's middleware has finished logging.
    records = [r for r in caplog.records if r.name == "cache_server.access"]
    assert len(records) == 3
    fields = [{k: getattr(r, k) for k in ("method", "route", "path", "status")} for r in records]
    assert fields == [
        {"method": "GET", "route": "/health", "path": "/health", "status": 200},
        {"method": "GET", "route": "/v1/records/{record_id}", "path": "/v1/records/7",
         "status": 404},
        {"method": "POST", "route": "/v1/lookup", "path": "/v1/lookup", "status": 404},
    ]  # fmt: skip
    assert [r.request_id for r in records] == [a.headers["X-Request-ID"] for a in answers]  # type: ignore[attr-defined]
    assert records[0].request_id == "first"  # type: ignore[attr-defined]
    assert all(r.duration_ms > 0 for r in records)  # type: ignore[attr-defined]
    assert records[0].getMessage().startswith("GET /health 200 ")


def test_a_database_error_leaves_the_gauges_out_of_the_scrape(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "cache.db"
    with (
        EmbeddedServer(f"sqlite:///{db}") as live,
        httpx.Client(base_url=live.url, timeout=10) as http,
    ):
        assert scrape(http).value("tunecache_jobs", state="queued") == 0
        with closing(sqlite3.connect(db)) as conn:
            conn.execute("DROP TABLE jobs")
        broken = scrape(http)
    assert "tunecache_jobs" not in broken.families
    assert "tunecache_records" not in broken.families
    assert broken.value("tunecache_http_requests_total", method="GET", route="/metrics",
                        status="200") == 1  # fmt: skip
    assert any("database gauges left out" in r.getMessage() for r in caplog.records)


def test_each_app_counts_in_its_own_registry() -> None:
    one, two = Metrics(), Metrics()
    one.count_lookup(rule="exact")
    one.observe_request(method="BREW", route="unmatched", status=405, seconds=0.001)
    a, b = Scrape(one.generate_latest().decode()), Scrape(two.generate_latest().decode())
    assert a.value("tunecache_lookups_total", result="hit", rule="exact") == 1
    assert b.value("tunecache_lookups_total", result="hit", rule="exact") == 0
    assert a.value("tunecache_http_requests_total", method="OTHER", route="unmatched",
                   status="405") == 1  # fmt: skip
    assert "tunecache_jobs" not in a.families  # no sessionmaker, no database gauges


@pytest.mark.slow
def test_serve_logs_json_lines(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    db = f"sqlite:///{tmp_path / 'cache.db'}"
    live = start_server(db, None, log, args=["--log-format", "json"])
    try:
        httpx.get(f"{live.url}/v1/records/5", headers={"X-Request-ID": "probe-1"}, timeout=10)
    finally:
        live.stop()
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    access = [e for e in entries if e["logger"] == "cache_server.access"]
    assert [e["route"] for e in access][-1] == "/v1/records/{record_id}"
    assert access[-1] | {"duration_ms": 0} == {
        "time": access[-1]["time"], "level": "INFO", "logger": "cache_server.access",
        "message": access[-1]["message"], "request_id": "probe-1", "method": "GET",
        "path": "/v1/records/5", "route": "/v1/records/{record_id}", "status": 404,
        "duration_ms": 0,
    }  # fmt: skip
    assert all(e["route"] == "/health" for e in access[:-1])
    assert not any(e["logger"] == "uvicorn.access" for e in entries)
    assert any(e["logger"].startswith("uvicorn") for e in entries)  # uvicorn's own, as JSON
    assert not any("color_message" in e for e in entries)


def test_workers_get_a_private_metrics_dir_unless_the_user_set_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with worker_metrics_dir() as made:
        assert os.environ[ENV] == made and Path(made).name.startswith("tunecache-metrics-")
        (Path(made) / "counter_1.db").write_bytes(b"")  # a worker's file
    assert ENV not in os.environ and not Path(made).exists()

    monkeypatch.setenv(ENV, str(tmp_path))
    with worker_metrics_dir() as given:
        assert given == str(tmp_path)
        (tmp_path / "counter_1.db").write_bytes(b"")
    assert os.environ[ENV] == str(tmp_path) and (tmp_path / "counter_1.db").exists()

    monkeypatch.setenv(ENV, str(tmp_path / "missing"))
    with pytest.raises(NotADirectoryError, match="missing"), worker_metrics_dir():
        pass


def served_by_worker(metrics_dir: Path, name: str, **labels: str) -> dict[str, float]:
    """Each worker's own count of one counter sample, read from its file (``counter_<pid>.db``)."""
    counts: dict[str, float] = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = path.stem.removeprefix("counter_")
        for metric in MultiProcessCollector.merge([str(path)]):
            for s in metric.samples:
                if s.name == name and s.labels == labels:
                    counts[pid] = s.value
    return counts


def settle(metrics_dir: Path, route: str, count: int) -> None:
    """Waits until the workers' files count ``count`` requests to ``route`` (timed, too): a worker
    counts a request just after answering it, so a client can be a little quicker."""
    labels = {"method": "GET" if route == "/metrics" else "POST", "route": route}
    deadline = time.monotonic() + 10
    while True:
        files = [str(path) for path in metrics_dir.glob("*.db")]
        samples = {(s.name, frozenset(s.labels.items())): s.value
                   for m in MultiProcessCollector.merge(files) for s in m.samples}  # fmt: skip
        counted = samples.get(("tunecache_http_request_duration_seconds_count",
                               frozenset(labels.items())))  # fmt: skip
        if (counted or 0) == count:
            return
        assert time.monotonic() < deadline, (route, counted, count)
        time.sleep(0.05)


@pytest.mark.slow
def test_every_scrape_sums_all_workers(tmp_path: Path) -> None:
    log, tmp = tmp_path / "server.log", tmp_path / "tmp"
    tmp.mkdir()  # the server's TMPDIR: where its metrics directory goes
    env = {"TMPDIR": str(tmp), "PROMETHEUS_MULTIPROC_DIR": ""}  # empty: unset, make its own
    fresh = {"Connection": "close"}  # a connection a request: requests spread over the workers
    lookup = {"key": make_key().to_json()}
    miss = {"result": "miss", "rule": "none"}
    live = start_server(f"sqlite:///{tmp_path / 'cache.db'}", None, log, env=env,
                        args=["--workers", "2"])  # fmt: skip
    url, process = live.url, live.process
    deadline = time.monotonic() + 60
    try:
        # Made before uvicorn started the workers; each worker adds its files as it builds its app.
        dirs = list(tmp.glob("tunecache-metrics-*"))
        assert len(dirs) == 1, f"no metrics directory of its own in {tmp}: {dirs}"
        (metrics_dir,) = dirs
        while len(list(metrics_dir.glob("counter_*.db"))) < 2:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

        def misses_by_worker() -> dict[str, float]:
            return served_by_worker(metrics_dir, "tunecache_lookups_total", **miss)

        sent = 0  # lookups (misses), until each worker has answered some of them
        while sent < 60 or min(misses_by_worker().values()) == 0:
            assert sent < 600, misses_by_worker()
            for _ in range(20):
                answer = httpx.post(f"{url}/v1/lookup", json=lookup, headers=fresh, timeout=10)
                assert answer.status_code == 404, answer.text
            sent += 20
        per_worker = misses_by_worker()
        settle(metrics_dir, "/v1/lookup", sent)
        scrapes = []
        for scraped in range(6):
            settle(metrics_dir, "/metrics", scraped)
            response = httpx.get(f"{url}/metrics", headers=fresh, timeout=10)
            assert response.status_code == 200, response.text
            scrapes.append(Scrape(response.text))
    finally:
        process.terminate()  # SIGTERM: uvicorn stops its workers, then serve removes the directory
        process.wait(timeout=30)
    assert process.returncode == 0, log.read_text()
    assert not metrics_dir.exists()
    assert list(tmp.iterdir()) == []

    assert len(per_worker) == 2 and sum(per_worker.values()) == sent
    requests = "tunecache_http_requests_total"
    duration = "tunecache_http_request_duration_seconds"
    for scraped, scrape_ in enumerate(scrapes):
        assert scrape_.value(requests, method="POST", route="/v1/lookup", status="404") == sent
        assert scrape_.value("tunecache_lookups_total", **miss) == sent
        assert scrape_.value("tunecache_lookups_total", result="hit", rule="exact") == 0
        assert scrape_.value(f"{duration}_count", method="POST", route="/v1/lookup") == sent
        assert scrape_.value(f"{duration}_bucket", method="POST", route="/v1/lookup",
                             le="+Inf") == sent  # fmt: skip
        # The scrapes before this one, whichever worker answered them (counted once answered).
        metrics_requests = scrape_.value(requests, method="GET", route="/metrics", status="200")
        assert (metrics_requests or 0) == scraped
        # Database gauges: once, from the answering worker, with no per-worker ("pid") label.
        lines = scrape_.text.splitlines()
        assert [line for line in lines if line.startswith("tunecache_records ")] == [
            "tunecache_records 0.0"
        ]
        statuses = [line for line in lines if line.startswith("tunecache_records_by_status{")]
        assert len(statuses) == 5 and all(line.endswith(" 0.0") for line in statuses), statuses
        jobs = [line for line in lines if line.startswith("tunecache_jobs")]
        assert len(jobs) == 4 and {scrape_.value("tunecache_jobs", state=state) for state in
                                   ("queued", "running", "done", "failed")} == {0}  # fmt: skip
        assert lines.count("# TYPE tunecache_records gauge") == 1
        assert lines.count("# TYPE tunecache_jobs gauge") == 1
        assert 'pid="' not in scrape_.text


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refuses_a_metrics_dir_that_is_not_one(tmp_path: Path, workers: str) -> None:
    missing = tmp_path / "no-such-dir"
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "serve", "--db", f"sqlite:///{tmp_path / 'c.db'}",
         "--port", "1", "--workers", workers],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, ENV: str(missing)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{ENV}={str(missing)!r} is not a directory" in done.stderr
    assert "Traceback" not in done.stderr and "serving" not in done.stderr
