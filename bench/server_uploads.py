"""Upload throughput and latency with concurrent uploaders, and that none gets a 5xx.

For each database (SQLite file, PostgreSQL throwaway cluster) and server worker count (1, 2), a
real ``tunecache serve`` is started on loopback; then ``--concurrency`` uploaders (threads, one
keep-alive connection each) post validated records back to back for ``--seconds``, twice:

* ``distinct keys``: every upload a new key (a team's pre-tune: daemons finishing different keys);
* ``one key``: every upload at the same key, each with its own time (the worst case for the
  key's lock that uploads, disputes and verifier findings take: :mod:`cache_server.twins`).

Reported: uploads answered per second, latency p50 / p99 (ms), and the answers by status (every
one should be 201; anything else is named). The uploaders run on the same machine as the server
and share its 2 cores. Results go to ``bench/results/server_uploads-<cpu>.md``. Figures, never
pass/fail.

    python -m bench.server_uploads [--seconds 5] [--concurrency 8] [--label TEXT]
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import sys
import tempfile
import threading
import time

from bench.report import write_result
from bench.server_load import TOKEN, _large_key, in_threads, percentile, serve
from tests.factories import make_key, make_record
from tests.pg import create_database, postgres_cluster
from tunecache_cli.table import render

BODIES = 4000  # distinct uploads prepared per mode (more than a run of a few seconds sends)


def bodies(mode: str, count: int) -> list[bytes]:
    """``count`` upload bodies: each at a new key (``distinct``) or all at one key (``one``)."""
    key = make_key(m=4096)
    made = []
    for i in range(count):
        record = make_record(_large_key(i) if mode == "distinct" else key,
                             time_ms=1.0 + i * 1e-3, trials=0)  # fmt: skip
        made.append(json.dumps(record.model_dump(mode="json", by_alias=True)).encode())
    return made


def upload_loop(url: str, sent: list[bytes], concurrency: int, seconds: float) -> tuple[
    list[float], collections.Counter[int]]:  # fmt: skip
    """``concurrency`` uploaders back to back for ``seconds``: latencies (ms) of the 201s, and
    every answer's status (0: the connection failed)."""
    host, port = url.removeprefix("http://").split(":")
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    latencies: list[float] = []
    statuses: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def uploader(c: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        i = c
        while time.perf_counter() < stop and i < len(sent):
            started = time.perf_counter()
            try:
                conn.request("POST", "/v1/records", sent[i], headers)
                response = conn.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                status = 0
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
            with lock:
                statuses[status] += 1
                if status == 201:
                    latencies.append((time.perf_counter() - started) * 1e3)
            i += concurrency
        conn.close()

    in_threads(uploader, concurrency)
    return latencies, statuses


def measure(db_name: str, db: str, workers: int, args: argparse.Namespace,
            prepared: dict[str, list[bytes]]) -> list[list[str]]:  # fmt: skip
    rows = []
    with serve(db, workers) as url:
        upload_loop(url, bodies("distinct", 20)[::-1], 2, 1.0)  # warm-up (keys of the end)
        for mode, sent in prepared.items():
            started = time.perf_counter()
            latencies, statuses = upload_loop(url, sent, args.concurrency, args.seconds)
            elapsed = time.perf_counter() - started
            others = ", ".join(f"{s or 'failed'}: {n}" for s, n in sorted(statuses.items())
                               if s != 201) or "none"  # fmt: skip
            rows.append([db_name, str(workers), f"{mode} keys" if mode == "distinct" else
                         "one key", f"{statuses[201] / elapsed:.0f}/s",
                         f"{percentile(latencies, 50):.1f}", f"{percentile(latencies, 99):.1f}",
                         str(statuses[201]), others])  # fmt: skip
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--label", default="", help="what this run measured (a commit)")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--workers", default="1,2")
    args = parser.parse_args(argv)
    prepared = {"distinct": bodies("distinct", BODIES), "one": bodies("one", BODIES)}
    workers = [int(w) for w in args.workers.split(",")]
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.databases.split(","):
            for count in workers:
                if name == "sqlite":
                    rows += measure(name, f"sqlite:///{tmp}/uploads-{count}.db", count, args,
                                    prepared)  # fmt: skip
                    continue
                with postgres_cluster() as cluster:
                    db = create_database(cluster, f"uploads{count}")
                    rows += measure(name, db, count, args, prepared)
    header = ["database", "workers", "uploads", "rate", "p50 ms", "p99 ms", "201", "other"]
    table = render(header, rows)
    print(table)
    write_result(
        "server_uploads" + (f"-{args.label}" if args.label else ""),
        "Cache server upload throughput with concurrent uploaders",
        [f"what: {args.label or 'this checkout'}",
         "server and uploaders on the same machine, sharing its cores",
         f"{args.concurrency} uploaders (threads, keep-alive), back to back for "
         f"{args.seconds:g} s per row, each upload a validated record of the built-in TVM "
         "matmul: at a new key each (distinct keys) or all at one key (one key); rate = 201s "
         "per second; other = every answer that was not 201"],
        table,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
