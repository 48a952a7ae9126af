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
"""

from __future__ import annotations

import argparse
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
    url: str, bodies: list[bytes], rate: float, seconds: float
) -> tuple[list[float], int]:
    """Requests due every 1/rate s; latency counts from the due time (no coordinated omission)."""
    due: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
    latencies: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        conn = _connection(url)
        while (item := due.get()) is not None:
            scheduled, body = item
            ok = _post(conn, body) == 200
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--rates", default="200,500,1000")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
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
