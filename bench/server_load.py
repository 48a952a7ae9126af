"""Lookup latency under load: p50/p99 at fixed request rates, and the maximum throughput.

For each database (SQLite file, PostgreSQL throwaway cluster) and server worker count (1, 2), a
real ``tunecache serve`` is started on loopback and filled with ``--keys`` winners; then

* open loop: lookups sent at 200, 500 and 1,000 requests/s for ``--seconds`` each (arrivals on a
  fixed schedule, so a slow server is not let off by a slow client), latency p50 / p99;
* closed loop: ``--concurrency`` clients back to back for ``--seconds``: the maximum throughput.

The load generator (asyncio + httpx) runs on the same machine as the server: on 2 cores it takes
one of them, so these are figures for "server and client on one 2-core box". Results are written
to ``bench/results/server_load-<cpu>.md``. Figures, never pass/fail.

    python -m bench.server_load [--seconds 5] [--keys 500] [--rates 200,500,1000]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from cache_server.embedded import free_port
from tests.factories import make_key, make_record
from tests.pg import create_database, postgres_cluster
from tunecache.cli.table import render
from tunecache.device import local_fingerprint

RESULTS = Path(__file__).with_name("results")


@contextmanager
def serve(db: str, workers: int) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
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
    with httpx.Client(base_url=url, timeout=60) as http:
        for m in range(1, keys + 1):
            key = make_key(m=m)
            http.post(
                "/v1/records",
                json=make_record(key, time_ms=1.0).model_dump(mode="json", by_alias=True),
            )
            bodies.append({"key": key.to_json()})
    return bodies


async def open_loop(
    url: str, bodies: list[dict[str, Any]], rate: float, seconds: float
) -> list[float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as http:

        async def one(i: int) -> None:
            started = time.perf_counter()
            response = await http.post("/v1/lookup", json=bodies[i % len(bodies)])
            if response.status_code == 200:
                latencies.append((time.perf_counter() - started) * 1e3)

        tasks = []
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks, return_exceptions=True)
    return latencies


async def closed_loop(
    url: str, bodies: list[dict[str, Any]], concurrency: int, seconds: float
) -> float:
    done = 0
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:

        async def client(offset: int) -> None:
            nonlocal done
            i = offset
            while time.perf_counter() < stop:
                response = await http.post("/v1/lookup", json=bodies[i % len(bodies)])
                done += response.status_code == 200
                i += concurrency

        await asyncio.gather(*(client(c) for c in range(concurrency)))
    return done / seconds


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else float("nan")


def measure(db_name: str, db: str, workers: int, args: argparse.Namespace) -> list[list[str]]:
    rows = []
    with serve(db, workers) as url:
        bodies = fill(url, args.keys)
        asyncio.run(open_loop(url, bodies, 100, 1.0))  # warm-up
        for rate in args.rates:
            lat = asyncio.run(open_loop(url, bodies, rate, args.seconds))
            sent = int(rate * args.seconds)
            rows.append([db_name, str(workers), f"{rate:g}/s", f"{len(lat)}/{sent}",
                         f"{percentile(lat, 50):.2f}", f"{percentile(lat, 99):.2f}"])  # fmt: skip
        top = asyncio.run(closed_loop(url, bodies, args.concurrency, args.seconds))
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
    device = local_fingerprint("cpu")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        f"# Cache server lookup latency and throughput ({device.raw_name or device.name})",
        "",
        f"- machine: {device.raw_name}, {device.units} cores, no GPU; server and load generator "
        "on the same machine (the client takes about one core)",
        f"- {args.keys} winners stored; POST /v1/lookup of stored keys; open loop "
        f"{args.seconds:g} s per rate; max = closed loop, {args.concurrency} concurrent clients",
        f"- run: {stamp}",
        "",
        "```",
        table,
        "```",
        "",
    ])  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"server_load-{device.name}.md"
    out.write_text(text)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
