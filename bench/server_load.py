"""Lookup latency under load: p50/p99 at fixed request rates, and the maximum throughput.

For each database (SQLite file, PostgreSQL throwaway cluster) and server worker count (1, 2), a
real ``tunecache serve`` is started on loopback and filled with ``--keys`` winners; then

* open loop: lookups due at 200, 500 and 1,000 requests/s for ``--seconds`` each, latency p50 /
  p99 counted from each request's due time (a backlog shows as latency: no coordinated omission);
* closed loop: ``--concurrency`` clients back to back for ``--seconds``: the maximum throughput.

The load generator (threads over keep-alive ``http.client`` connections) runs on the same machine
as the server and shares its 2 cores, so these are figures for "server and client on one box". Results are written
to ``bench/results/server_load-<cpu>.md``. Figures, never pass/fail.

    python -m bench.server_load [--seconds 5] [--keys 500] [--rates 200,500,1000]

``--large N`` measures instead whether a lookup's cost grows with the cache: N winners of one
arch (1,000 widths × 100 row counts of one GEMM, written straight into the database), then open
loop at ``--large-rate`` lookups/s of three kinds — an exact hit, a bucket hit (a row count not
stored, in a stored bucket) and a miss (a width not stored) — on SQLite and PostgreSQL.

    python -m bench.server_load --large 100000 [--large-rate 50] [--seconds 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from bench.report import write_result
from cache_server.embedded import free_port
from tests.factories import make_key, make_record
from tests.pg import create_database, postgres_cluster
from tunecache.cli.table import render
from tunecache.tokens import new_token

OPEN_LOOP_THREADS = 32  # keep-alive connections serving the open-loop schedule
TOKEN = new_token()  # the servers' bootstrap admin token, to fill them


@contextmanager
def serve(db: str, workers: int) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TUNECACHE_SERVER_BOOTSTRAP_TOKEN": TOKEN}
    process = subprocess.Popen(
        [sys.executable, "-m", "tunecache.cli", "serve", "--db", db, "--port", str(port),
         "--workers", str(workers)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"server on {db} did not start")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def fill(url: str, keys: int) -> list[dict[str, Any]]:
    bodies = []
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=60, headers=auth) as client:
        for m in range(1, keys + 1):
            key = make_key(m=m)
            client.post(
                "/v1/records",
                json=make_record(key, time_ms=1.0).model_dump(mode="json", by_alias=True),
            ).raise_for_status()
            bodies.append({"key": key.to_json()})
    return bodies


def _connection(url: str) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=10)


def _post(conn: http.client.HTTPConnection, body: bytes) -> int:
    conn.request("POST", "/v1/lookup", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def open_loop(
    url: str, bodies: list[bytes], rate: float, seconds: float, expected: int = 200
) -> tuple[list[float], int]:
    """Requests due every 1/rate s; latency counts from the due time (no coordinated omission)."""
    due: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
    latencies: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        conn = _connection(url)
        while (item := due.get()) is not None:
            scheduled, body = item
            ok = _post(conn, body) == expected
            if ok:
                with lock:
                    latencies.append((time.perf_counter() - scheduled) * 1e3)
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(OPEN_LOOP_THREADS)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    sent = int(rate * seconds)
    for i in range(sent):
        scheduled = start + i / rate
        if (delay := scheduled - time.perf_counter()) > 0:
            time.sleep(delay)
        due.put((scheduled, bodies[i % len(bodies)]))
    for _ in threads:
        due.put(None)
    for t in threads:
        t.join()
    return latencies, sent


def closed_loop(url: str, bodies: list[bytes], concurrency: int, seconds: float) -> float:
    """Requests per second with ``concurrency`` clients sending back to back."""
    done = [0] * concurrency
    stop = time.perf_counter() + seconds

    def client(c: int) -> None:
        conn = _connection(url)
        i = c
        while time.perf_counter() < stop:
            done[c] += _post(conn, bodies[i % len(bodies)]) == 200
            i += concurrency
        conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / seconds


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else float("nan")


def measure(db_name: str, db: str, workers: int, args: argparse.Namespace) -> list[list[str]]:
    rows = []
    with serve(db, workers) as url:
        bodies = [json.dumps(b).encode() for b in fill(url, args.keys)]
        open_loop(url, bodies, 100, 1.0)  # warm-up
        for rate in args.rates:
            lat, sent = open_loop(url, bodies, rate, args.seconds)
            rows.append([db_name, str(workers), f"{rate:g}/s", f"{len(lat)}/{sent}",
                         f"{percentile(lat, 50):.2f}", f"{percentile(lat, 99):.2f}"])  # fmt: skip
        top = closed_loop(url, bodies, args.concurrency, args.seconds)
        rows.append([db_name, str(workers), "max", f"{top:.0f}/s", "-", "-"])
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _large_key(i: int) -> Any:
    """The i-th winner of the large cache: width 64 + i // 100, rows 1 + i % 100."""
    key = make_key(m=1 + i % 100)
    return dataclasses.replace(key, problem={"M": 1 + i % 100, "N": 64 + i // 100, "K": 64})


def fill_directly(db: str, winners: int) -> None:
    """Writes ``winners`` validated records straight into ``db`` (migrated first), in batches."""
    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.migrate import upgrade
    from cache_server.queries import add_record

    upgrade(db)
    sessions = make_sessionmaker(make_engine(db))
    started = time.perf_counter()
    for first in range(0, winners, 1000):
        with sessions() as session:
            for i in range(first, min(first + 1000, winners)):
                key = _large_key(i)
                add_record(session, key_hash=key.digest(), record=make_record(key, trials=0))
            session.commit()
    print(f"{winners} winners written in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def measure_large(db_name: str, db: str, args: argparse.Namespace) -> list[list[str]]:
    fill_directly(db, args.large)
    widths = args.large // 100
    kinds = {
        "exact hit": [_large_key(i) for i in range(0, args.large, 97)],
        # Row counts 101..128 are not stored; their bucket (65..128) is: served by the bucket rule.
        "bucket hit": [dataclasses.replace(k, problem={**k.problem, "M": 101 + j % 28})
                       for j, k in enumerate(_large_key(i) for i in range(0, args.large, 97))],
        "miss": [dataclasses.replace(k, problem={**k.problem, "N": 64 + widths + j})
                 for j, k in enumerate(_large_key(i) for i in range(0, args.large, 97))],
    }  # fmt: skip
    rows = []
    with serve(db, 1) as url:
        for kind, keys in kinds.items():
            bodies = [json.dumps({"key": k.to_json()}).encode() for k in keys]
            expected = 404 if kind == "miss" else 200
            lat, sent = open_loop(url, bodies, args.large_rate, args.seconds, expected)
            rows.append([db_name, f"{args.large}", kind, f"{args.large_rate:g}/s",
                         f"{len(lat)}/{sent}", f"{percentile(lat, 50):.2f}",
                         f"{percentile(lat, 99):.2f}"])  # fmt: skip
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main_large(args: argparse.Namespace) -> int:
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += measure_large("sqlite", f"sqlite:///{tmp}/large.db", args)
    with postgres_cluster() as admin:
        rows += measure_large("postgresql", create_database(admin, "large"), args)
    header = ["database", "winners", "lookup", "rate", "answered", "p50 ms", "p99 ms"]
    table = render(header, rows)
    print(table)
    write_result(
        "server_load_large",
        "Lookup latency with a large cache: exact hit, bucket hit and miss",
        [
            "server (1 worker) and load generator on the same machine, sharing its cores",
            f"{args.large} winners of one arch (1,000 widths x 100 row counts of one GEMM); "
            f"open loop {args.large_rate:g} lookups/s for {args.seconds:g} s per kind, latency "
            "from each request's due time; answered = with the expected status (200, or 404 "
            "for a miss)",
        ],
        table,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--rates", default="200,500,1000")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--large", type=int, help="winners of one arch: the large-cache case")
    parser.add_argument("--large-rate", type=float, default=50.0)
    args = parser.parse_args(argv)
    if args.large:
        return main_large(args)
    args.rates = [float(r) for r in args.rates.split(",")]
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            rows += measure("sqlite", f"sqlite:///{tmp}/load{workers}.db", workers, args)
    with postgres_cluster() as admin:
        for workers in (1, 2):
            rows += measure("postgresql", create_database(admin, f"load{workers}"), workers, args)
    header = ["database", "workers", "rate", "answered", "p50 ms", "p99 ms"]
    table = render(header, rows)
    print(table)
    write_result(
        "server_load",
        "Cache server lookup latency and throughput",
        [
            "server and load generator on the same machine, sharing its cores",
            f"{args.keys} winners stored; POST /v1/lookup of stored keys; open loop "
            f"{args.seconds:g} s per rate, latency from each request's due time; max = closed "
            f"loop, {args.concurrency} concurrent clients",
        ],
        table,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
