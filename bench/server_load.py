"""Lookup latency under load: p50/p99 at fixed request rates, and the maximum throughput.

For each database (SQLite file, PostgreSQL throwaway cluster) and server worker count (1, 2), a
real ``tunecache serve`` is started on loopback and filled with ``--keys`` winners; then

* open loop: lookups due at 200, 500 and 1,000 requests/s for ``--seconds`` each, latency p50 /
  p99 counted from each request's due time (a backlog shows as latency: no coordinated omission);
* closed loop: ``--concurrency`` clients back to back for ``--seconds``: the maximum throughput.

The load generator (one event loop over keep-alive connections) runs on the same machine
as the server and shares its 2 cores, so these are figures for "server and client on one box". Results are written
to ``bench/results/server_load-<cpu>.md``. Figures, never pass/fail.

    python -m bench.server_load [--seconds 5] [--keys 500] [--rates 200,500,1000]

``--large N`` measures instead whether a lookup's cost grows with the cache: N winners of one
arch (1,000 widths × 100 row counts of one GEMM, written straight into the database), then open
loop at ``--large-rate`` lookups/s of three kinds — an exact hit, a bucket hit (a row count not
stored, in a stored bucket) and a miss (a width not stored) — on SQLite and PostgreSQL.

    python -m bench.server_load --large 100000 [--large-rate 50] [--seconds 10]

``--overload`` measures load shedding: a SQLite server (1 worker) over ``--large`` winners (default
100,000), bucket lookups; its sustainable rate is the highest of ``--overload-rates`` it answers
with no 503 and a p99 under 50 ms; then lookups at twice that rate: how many were admitted (their
p50/p99) and how many refused with 503 (and how fast). ``--floods`` sends 16 anonymous 16 MiB
bodies at once (streamed, no declared length) while ``/health`` is asked every 20 ms: the server's
peak memory and ``/health``'s latency.

    python -m bench.server_load --overload [--large 100000] [--seconds 10]
    python -m bench.server_load --floods
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import http.client
import json
import multiprocessing
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.report import write_result
from cache_server.embedded import free_port
from tests.factories import make_key, make_record
from tests.pg import create_database, postgres_cluster
from tunecache.schemas import KeyModel
from tunecache.tokens import new_token
from tunecache_cli.table import render

OPEN_LOOP_THREADS = 32  # keep-alive connections serving the open-loop schedule (at most)
TOKEN = new_token()  # the servers' bootstrap admin token, to fill them


@contextmanager
def serve(db: str, workers: int, keep_pid: bool = False) -> Iterator[Any]:
    """A server on ``db``: yields its URL (and its process id with ``keep_pid``)."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TUNECACHE_SERVER_BOOTSTRAP_TOKEN": TOKEN}
    process = subprocess.Popen(
        [sys.executable, "-m", "tunecache_cli", "serve", "--db", db, "--port", str(port),
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
        yield (url, process.pid) if keep_pid else url
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
    """Requests due every 1/rate s; latency counts from the due time (no coordinated omission).
    The latencies of the answers with the ``expected`` status, and how many were sent."""
    by_status, sent = open_loop_by_status(url, bodies, rate, seconds)
    return by_status.get(expected, []), sent


def open_loop_by_status(
    url: str, bodies: list[bytes], rate: float, seconds: float
) -> tuple[dict[int, list[float]], int]:
    """:func:`open_loop`'s latencies (ms) of every answer, by status; how many were sent.

    One event loop on keep-alive connections (up to ``OPEN_LOOP_THREADS``), no threads: a
    generator of threads measured its own waits for the GIL as the server's latency (32 threads
    on 2 cores), worst in the tail."""
    return asyncio.run(_open_loop(url, bodies, rate, seconds))


async def _open_loop(
    url: str, bodies: list[bytes], rate: float, seconds: float
) -> tuple[dict[int, list[float]], int]:
    host, port = url.removeprefix("http://").split(":")
    idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None] = asyncio.Queue()
    for _ in range(OPEN_LOOP_THREADS):
        idle.put_nowait(None)  # a connection slot, opened on first use
    latencies: dict[int, list[float]] = {}

    async def one(scheduled: float, body: bytes) -> None:
        conn = await idle.get()
        try:
            if conn is None:
                conn = await asyncio.open_connection(host, int(port))
            reader, writer = conn
            writer.write(b"POST /v1/lookup HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                         b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (host.encode(), len(body), body))  # fmt: skip
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").lower().split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            await reader.readexactly(int(headers.get("content-length", "0")))
            status = int(lines[0].split()[1])
            latencies.setdefault(status, []).append((time.perf_counter() - scheduled) * 1e3)
            if headers.get("connection") == "close":
                writer.close()
                conn = None
        except (OSError, asyncio.IncompleteReadError):
            latencies.setdefault(0, []).append((time.perf_counter() - scheduled) * 1e3)
            conn = None
        idle.put_nowait(conn)

    tasks = []
    start = time.perf_counter()
    sent = int(rate * seconds)
    for i in range(sent):
        scheduled = start + i / rate
        if (delay := scheduled - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled, bodies[i % len(bodies)])))
    await asyncio.gather(*tasks)
    while not idle.empty():
        if (conn := idle.get_nowait()) is not None:
            conn[1].close()
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

    in_threads(client, concurrency)
    return sum(done) / seconds


def in_threads(work: Callable[[int], None], count: int) -> None:
    """``work(0)`` … ``work(count - 1)``, each in a thread of its own, all at once; returns when
    every one has."""
    threads = [threading.Thread(target=work, args=(c,)) for c in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, within the values (no extrapolation past the largest)."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


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
    """Writes ``winners`` validated records (and their winner rows) straight into ``db``
    (migrated first), 5,000 per transaction, as the server's own ``record_row`` builds them."""
    from sqlalchemy import insert

    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.migrate import upgrade
    from cache_server.models import WinnerRow, utcnow
    from cache_server.queries import record_row

    upgrade(db)
    engine = make_engine(db)
    sessions = make_sessionmaker(engine)
    started = time.perf_counter()
    template = make_record(_large_key(0), trials=0)
    for first in range(0, winners, 5000):
        with sessions.begin() as session:
            rows = []
            for i in range(first, min(first + 5000, winners)):
                key = _large_key(i)
                record = template.model_copy(update={"key": KeyModel.from_key(key)})
                rows.append(record_row(key_hash=key.digest(), record=record))
            session.add_all(rows)
            session.flush()
            now = utcnow()
            session.execute(insert(WinnerRow), [
                {"key_hash": r.key_hash, "record_id": r.id, "time_ms": r.time_ms,
                 "updated_at": now} for r in rows])  # fmt: skip
    if engine.dialect.name == "postgresql":  # statistics, as autovacuum keeps them in service
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE")
    engine.dispose()
    took = time.perf_counter() - started
    print(f"{winners} winners written in {took:.0f} s", file=sys.stderr, flush=True)


def _bucket_bodies(winners: int) -> list[bytes]:
    """Bucket-hit lookups of the large cache: row counts 101..128 are not stored, their bucket
    (65..128) is."""
    keys = [_large_key(i) for i in range(0, winners, 97)]
    return [json.dumps({"key": dataclasses.replace(k, problem={**k.problem, "M": 101 + j % 28})
                        .to_json()}).encode() for j, k in enumerate(keys)]  # fmt: skip


def measure_large(db_name: str, db: str, args: argparse.Namespace) -> list[list[str]]:
    fill_directly(db, args.large)
    widths = args.large // 100
    stored = [_large_key(i) for i in range(0, args.large, 97)]
    kinds = {
        "exact hit": [json.dumps({"key": k.to_json()}).encode() for k in stored],
        "bucket hit": _bucket_bodies(args.large),
        "miss": [json.dumps({"key": dataclasses.replace(
            k, problem={**k.problem, "N": 64 + widths + j}).to_json()}).encode()
            for j, k in enumerate(stored)],
    }  # fmt: skip
    rows = []
    with serve(db, args.large_workers) as url:
        for kind, bodies in kinds.items():
            expected = 404 if kind == "miss" else 200
            lat, sent = open_loop(url, bodies, args.large_rate, args.seconds, expected)
            rows.append([db_name, str(args.large_workers), f"{args.large}", kind,
                         f"{args.large_rate:g}/s",
                         f"{len(lat)}/{sent}", f"{percentile(lat, 50):.2f}",
                         f"{percentile(lat, 99):.2f}"])  # fmt: skip
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def measure_overload(db: str, args: argparse.Namespace) -> list[list[str]]:
    """The sustainable rate of bucket lookups (no 503, p99 under 50 ms), then twice it."""
    fill_directly(db, args.large)
    bodies = _bucket_bodies(args.large)
    rows = []
    with serve(db, 1) as url:
        open_loop(url, bodies, 50, 2.0)  # warm-up
        sustainable = 0.0
        for rate in args.overload_rates:
            by_status, sent = open_loop_by_status(url, bodies, rate, args.seconds)
            rows.append(_overload_row("rate", rate, by_status, sent))
            print(rows[-1], file=sys.stderr, flush=True)
            ok = by_status.get(200, [])
            if 503 not in by_status and len(ok) == sent and percentile(ok, 99) <= 50:
                sustainable = rate
        if sustainable:
            twice = 2 * sustainable
            by_status, sent = open_loop_by_status(url, bodies, twice, args.seconds)
            rows.append(_overload_row("2x sustainable", twice, by_status, sent))
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _overload_row(what: str, rate: float, by_status: dict[int, list[float]],
                  sent: int) -> list[str]:  # fmt: skip
    ok, shed = by_status.get(200, []), by_status.get(503, [])
    other = sent - len(ok) - len(shed)
    return [what, f"{rate:g}/s", f"{len(ok)}/{sent}", f"{percentile(ok, 50):.2f}",
            f"{percentile(ok, 99):.2f}", str(len(shed)), f"{percentile(shed, 50):.2f}",
            f"{percentile(shed, 99):.2f}", str(other)]  # fmt: skip


def main_overload(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure_overload(f"sqlite:///{tmp}/overload.db", args)
    header = ["load", "rate", "200", "p50 ms", "p99 ms", "503", "503 p50 ms", "503 p99 ms",
              "other"]  # fmt: skip
    table = render(header, rows)
    print(table)
    write_result(
        "server_overload",
        "Load shedding: bucket lookups up to and past the sustainable rate",
        [
            "server (1 worker, SQLite, default shedding settings) and load generator on the "
            "same machine, sharing its cores",
            f"{args.large} winners of one arch; bucket-hit lookups, open loop "
            f"{args.seconds:g} s per rate; latency from each request's due time, of the answers "
            "admitted (200) and of those refused (503); sustainable = the highest rate with no "
            "503 and a p99 under 50 ms",
        ],
        table,
    )
    return 0


def _flood(host: str, port: int, mib: int, stop: float, statuses: list[int]) -> None:
    """Sends anonymous ``mib`` MiB bodies (chunked, no declared length) until ``stop``, each on
    a new connection, reading the answer as soon as the server sends one."""
    chunk = b"[" + b"{}," * 21_845  # 64 KiB of [{},{},…]
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    head = (b"POST /v1/lookup HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" % host.encode())  # fmt: skip
    while time.perf_counter() < stop:
        status = 0  # the connection was reset before an answer could be read
        with socket.create_connection((host, port), timeout=120) as sock:
            try:
                sock.sendall(head)
                for _ in range(mib * 16):
                    if select.select([sock], [], [], 0)[0]:
                        break  # answered before the body ended
                    sock.sendall(frame)
                status = int(sock.recv(4096).split()[1])
            except (OSError, IndexError, ValueError):
                pass
        statuses.append(status)


def _flood_process(host: str, port: int, count: int, mib: int, seconds: float,
                   out: Any) -> None:  # fmt: skip
    statuses: list[int] = []
    out.put("flooding")
    stop = time.perf_counter() + seconds
    threads = [threading.Thread(target=_flood, args=(host, port, mib, stop, statuses))
               for _ in range(count)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(statuses)


def floods(url: str, count: int, mib: int, seconds: float) -> tuple[list[int], list[float]]:
    """``count`` clients sending anonymous ``mib`` MiB bodies (streamed) again and again for
    ``seconds``, /health asked every 20 ms meanwhile: the floods' statuses and /health's
    latencies (ms). The flooders run in a process of their own (raw sockets): threads of this
    one would have measured their own waits for the GIL as /health's latency."""
    host, port = url.removeprefix("http://").split(":")
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    flooders = context.Process(target=_flood_process,
                               args=(host, int(port), count, mib, seconds, out))  # fmt: skip
    flooders.start()
    assert out.get(timeout=120) == "flooding"
    health: list[float] = []
    stop = time.perf_counter() + seconds
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    while time.perf_counter() < stop:
        started = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        health.append((time.perf_counter() - started) * 1e3)
        time.sleep(0.02)
    conn.close()
    statuses: list[int] = out.get(timeout=300)
    flooders.join()
    return statuses, health


def main_floods(args: argparse.Namespace) -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, db in (("sqlite", f"sqlite:///{tmp}/floods.db"),):
            with serve(db, 1, keep_pid=True) as (url, pid):
                statuses, health = floods(url, 16, 16, args.seconds)
                peak = _peak_mb(pid)
            other = len(statuses) - statuses.count(413) - statuses.count(0)
            rows.append([name, "16 x 16 MiB", str(len(statuses)), str(statuses.count(413)),
                         str(statuses.count(0)), str(other),
                         f"{peak:.0f}", str(len(health)), f"{percentile(health, 50):.2f}",
                         f"{percentile(health, 99):.2f}", f"{max(health):.2f}"])  # fmt: skip
    header = ["database", "anonymous bodies", "sent", "413", "reset", "other", "peak MB",
              "/health", "p50 ms", "p99 ms", "max ms"]  # fmt: skip
    table = render(header, rows)
    print(table)
    write_result(
        "server_floods",
        "Anonymous floods: 16 parallel 16 MiB bodies against one server process",
        ["server (1 worker) and the flooding clients on the same machine, sharing its cores",
         "16 clients (threads of one process, raw sockets) each sending 16 MiB bodies again "
         f"and again for {args.seconds:g} s, streamed without a declared length, each on a new "
         "connection; /health asked every 20 ms meanwhile from another process; reset = the "
         "server closed the connection on the rest of the body before its 413 could be read; "
         "peak MB = the server process's peak resident memory (VmHWM)"],
        table,
    )  # fmt: skip
    return 0


def _peak_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmHWM")) / 1024  # fmt: skip


def main_large(args: argparse.Namespace) -> int:
    rows: list[list[str]] = []
    if args.only in (None, "sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            rows += measure_large("sqlite", f"sqlite:///{tmp}/large.db", args)
    if args.only in (None, "postgresql"):
        with postgres_cluster() as admin:
            rows += measure_large("postgresql", create_database(admin, "large"), args)
    header = ["database", "workers", "winners", "lookup", "rate", "answered", "p50 ms",
              "p99 ms"]  # fmt: skip
    table = render(header, rows)
    print(table)
    write_result(
        "server_load_large" + ("" if args.large_workers == 1 else f"_{args.large_workers}workers"),
        "Lookup latency with a large cache: exact hit, bucket hit and miss",
        [
            "server and load generator on the same machine, sharing its cores; a lookup over "
            "the server's capacity gets 503 (not counted as answered)",
            f"{args.large} winners of one arch (widths x 100 row counts of one GEMM); "
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
    parser.add_argument("--large-workers", type=int, default=1)
    parser.add_argument("--only", choices=["sqlite", "postgresql"], help="one database")
    parser.add_argument("--overload", action="store_true", help="the load-shedding table")
    parser.add_argument("--overload-rates", default="100,150,200,250,300")
    parser.add_argument("--floods", action="store_true", help="16 anonymous 16 MiB bodies")
    args = parser.parse_args(argv)
    if args.floods:
        return main_floods(args)
    if args.overload:
        args.large = args.large or 100_000
        args.overload_rates = [float(r) for r in args.overload_rates.split(",")]
        return main_overload(args)
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
