"""``tunecache demo``: the whole loop on this machine, on an embedded SQLite server.

1. start a cache server in this process on a SQLite file;
2. tune a small set of keys with TVM and Inductor, validate and upload each winner;
3. print the table of winners;
4. fetch every key through the client from a fresh process and report hit or miss.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tunecache.timing import noise_text, versus
from tunecache_cli.args import check_trials
from tunecache_cli.table import ms, render
from tunecache_cli.trials import config_text

DEMO_WORKLOADS = ("matmul", "softmax", "layernorm", "bias_gelu")
DEMO_BACKENDS = ("tvm", "inductor")


def register(commands: Any) -> None:
    parser = commands.add_parser("demo", help="tune, store, serve and fetch a small set")
    parser.add_argument("--db", metavar="URL", help="database URL (default: a temp SQLite file)")
    parser.add_argument("--trials", type=int, default=32, help="search budget per key")
    parser.add_argument(
        "--workloads",
        default=",".join(DEMO_WORKLOADS),
        help=f"comma-separated workloads (default: {','.join(DEMO_WORKLOADS)})",
    )
    parser.set_defaults(run=run)


def _tune_all(
    url: str, token: str, workdir: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    from backends import Budget
    from tunecache.client import Client
    from tunecache.errors import TuningError
    from tunecache.key import key_for
    from tunecache_cli.progress import ProgressPrinter
    from tuner import TuneOptions, tune
    from tuner.harness import Harness
    from workloads import get_workload

    rows: list[dict[str, Any]] = []
    names = [get_workload(n.strip()).name for n in args.workloads.split(",")]
    options = TuneOptions(workdir=workdir)
    # One harness for every key: its workers start once.
    with Client(url, token=token) as client, Harness() as harness:
        for name in names:
            problem = dict(get_workload(name).demo_problem)
            for backend in DEMO_BACKENDS:
                spec: dict[str, Any] = {
                    "workload": name,
                    "backend": backend,
                    "problem": problem,
                    "dtype": "float32",
                }
                key = key_for(name, backend, problem, "float32")
                label = key.short()
                try:
                    with ProgressPrinter(label) as progress:
                        outcome = tune(key, Budget(trials=args.trials), options,
                                       harness=harness, progress=progress)  # fmt: skip
                except TuningError as exc:
                    print(f"{label}: FAILED: {exc}", file=sys.stderr)
                    rows.append({"spec": spec, "label": label, "record": None})
                    continue
                uploaded = client.upload(outcome.record)
                rows.append(
                    {"spec": spec, "label": label, "record": client.get_record(uploaded.record_id)}
                )
    return rows


def _winners_table(rows: list[dict[str, Any]]) -> str:
    table = []
    for row in rows:
        record = row["record"]
        if record is None:
            table.append([row["label"], row["spec"]["backend"], "FAILED", *["-"] * 7])
            continue
        baseline = {b.name: b.timing.median_ms for b in record.baselines}
        table.append(
            [
                record.key.to_key().short().rsplit(" ", 2)[0],
                record.key.backend,
                config_text(record.key.backend, record.config, 56),
                ms(record.timing.median_ms),
                ms(baseline.get("default_config")),
                ms(baseline.get("torch_eager")),
                versus(record, "default_config"),
                versus(record, "torch_eager"),
                "noisy" if record.noisy else "-",
                f"{record.validation.max_rel_error:.1e}",
            ]
        )
    header = ["key", "backend", "best config", "tuned ms", "default ms", "eager ms",
              "vs default", "vs eager", "timing", "max rel err"]  # fmt: skip
    return render(header, table)


def _fetch_in_fresh_process(
    url: str, token: str, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each row's key looked up by a fresh process with the demo server's own token (the user's
    ``TUNECACHE_TOKEN``, another server's, made every lookup a 401: each key a MISS, unsaid);
    what the process said is shown when it failed or missed a key."""
    request = json.dumps({"server": url, "token": token, "keys": [row["spec"] for row in rows]})
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli.fetch"],
        input=request,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    fetched = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if done.stderr.strip() and (done.returncode != 0 or not all(f["hit"] for f in fetched)):
        print(done.stderr, file=sys.stderr)
    return fetched


def run(args: argparse.Namespace) -> int:
    from cache_server.embedded import EmbeddedServer
    from workloads import get_workload

    check_trials("--trials", args.trials)
    if args.db:  # a URL of another database was an internal error (its driver, missing)
        from tunecache_cli.serve import server_settings

        args.db = server_settings(args).db
    for name in args.workloads.split(","):
        get_workload(name.strip())  # an unknown name fails here, before the server starts
    with tempfile.TemporaryDirectory(prefix="tunecache-demo-") as tmp:
        db = args.db or f"sqlite:///{Path(tmp) / 'tunecache.db'}"
        with EmbeddedServer(db) as server:
            print(f"embedded cache server on {server.url}, database {db}", file=sys.stderr)
            token = server.issue_token("demo", "write")
            rows = _tune_all(server.url, token, Path(tmp) / "work", args)
            print(
                "\nValidated winners. Median ms on this CPU; default = the backend untuned "
                "(TVM: no schedule, Inductor: torch.compile default), eager = torch eager.\n"
                "Speedups: the median of alternating rounds, with its interval (95 % from 6 "
                "rounds on; of 5, their whole range: 93.8 %); "
                "'noisy': the machine disturbed a timing of the row (which, and why, below).\n"
            )
            print(_winners_table(rows))
            for row in rows:
                if row["record"] is not None and row["record"].noisy:
                    print(f"{row['label']}: {noise_text(row['record'])}")
            fetched = _fetch_in_fresh_process(server.url, token, rows)
        print("\nFetched through tunecache.Client in a fresh process\n")
        print(
            render(
                ["key", "result", "record"],
                [
                    [f["label"], "hit" if f["hit"] else "MISS", f["record_id"] or "-"]
                    for f in fetched
                ],
            )
        )
    validated = sum(1 for row in rows if row["record"] is not None)
    hits = sum(1 for f in fetched if f["hit"])
    print(f"\n{validated} validated records, {hits}/{len(rows)} fetched as hits")
    return 0 if validated == len(rows) == hits else 1
