"""What reading artifacts costs the server when each token keeps its own copy of an item.

A read serves each item once, from its best live copy (:func:`cache_server.artifacts.list_artifacts`:
a copy is served when no better live copy of its item exists, asked of the rows a page reads).
This times, in process (no HTTP), a whole partition read page by page as a client reads it
(``after``, 1,000 items a page) and one key's read, for a partition of ``--items`` items held in
1, 2 or 3 copies by as many tokens, on a fresh SQLite file (and a PostgreSQL database with
``--postgres URL``, an empty database it may fill).

Writes ``bench/results/artifact_reads-<cpu>.md``: median, min and max of ``--repeats`` reads.
Figures, never pass/fail.

    python -m bench.artifact_reads [--items 20000] [--repeats 5] [--postgres URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.report import write_result
from tunecache_cli.table import render

NS, PART, PAGE = "inductor.choices", "p", 1000
ITEMS_PER_KEY = 50


def fill(url: str, copies: int, items: int) -> Callable[[], object]:
    """A fresh schema at ``url`` holding ``items`` items in ``copies`` copies; returns a maker
    of sessions."""
    from cache_server import tokens
    from cache_server.artifacts import put_artifacts
    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.migrate import upgrade
    from tunecache.artifacts import ArtifactIn

    upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    with sessions.begin() as session:
        for n in range(copies):
            token = tokens.issue(session, name=f"bench-{n}", scope="write")[1]
            batch = [ArtifactIn(namespace=NS, partition=PART, key=f"k{i // ITEMS_PER_KEY}",
                                item=str(i % ITEMS_PER_KEY), score=float(n + i % 7),
                                value={"op": "mm", "inputs": f"[{i}]", "precision": "highest",
                                       "timings": {"c": 1.0}})
                     for i in range(items)]  # fmt: skip
            put_artifacts(session, items=batch, uploader=token)
    return sessions


def timed(read: Callable[[], int], repeats: int) -> tuple[int, list[float]]:
    seconds, got = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        got = read()
        seconds.append(time.perf_counter() - start)
    return got, seconds


def reads(sessions: Callable[[], object]) -> dict[str, Callable[[], int]]:
    from cache_server.artifacts import list_artifacts

    def whole() -> int:
        with sessions() as session:  # type: ignore[attr-defined]
            after, got = None, 0
            while True:
                page, after = list_artifacts(session, namespace=NS, partition=PART, key=None,
                                             after=after, limit=PAGE, budget=8 << 20)  # fmt: skip
                got += len(page)
                if after is None:
                    return got

    def one_key() -> int:
        with sessions() as session:  # type: ignore[attr-defined]
            page, _ = list_artifacts(session, namespace=NS, partition=PART, key="k7", after=None,
                                     limit=PAGE, budget=8 << 20)  # fmt: skip
            return len(page)

    return {"whole partition, by pages": whole, "one key": one_key}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--postgres", help="an empty PostgreSQL database's URL, to fill")
    args = parser.parse_args(argv)
    rows = []
    for copies in (1, 2, 3):
        urls = {"sqlite": f"sqlite:///{Path(tempfile.mkdtemp()) / 'bench.db'}"}
        if args.postgres and copies == 1:  # one fill: the database is not emptied between
            urls["postgresql"] = args.postgres
        for kind, url in urls.items():
            for name, read in reads(fill(url, copies, args.items)).items():
                got, seconds = timed(read, args.repeats)
                ms = [s * 1000 for s in seconds]
                rows.append([kind, str(copies), name, str(got), f"{statistics.median(ms):.1f}",
                             f"{min(ms):.1f}", f"{max(ms):.1f}"])  # fmt: skip
    table = render(["database", "copies", "read", "items", "median ms", "min", "max"], rows)
    notes = [f"{args.items} items, {ITEMS_PER_KEY} a key, each in as many copies as tokens",
             f"in process, no HTTP; {PAGE} items a page; {args.repeats} reads each"]  # fmt: skip
    write_result("artifact_reads", "Reading artifacts kept in a copy per token", notes, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
