"""One CPU daemon on the demo's keys: keys per hour, and what the queue costs per job.

Queues the demo's keys (matmul, softmax, layernorm, bias_gelu × TVM, Inductor at the demo's
problems) on a real server on loopback, runs one daemon until the queue is empty, and times every
queue call it makes (claim, heartbeat, upload, complete) against the whole run. Results go to
``bench/results/daemon_throughput-<cpu>.md``. Figures, never pass/fail.

    python -m bench.daemon_throughput [--trials 32]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

from bench.report import write_result
from bench.server_load import TOKEN, serve
from tunecache import Client, key_for
from tunecache_cli.table import render
from tuner.daemon import Daemon, DaemonOptions
from workloads import get_workload

KERNELS = ("matmul", "softmax", "layernorm", "bias_gelu")
QUEUE_CALLS = ("claim_job", "heartbeat_job", "upload", "complete_job", "fail_job")


class TimedClient(Client):
    """A client that adds up the seconds spent in each queue call."""

    spent: dict[str, float]
    calls: dict[str, int]

    def __getattribute__(self, name: str) -> Any:
        found = super().__getattribute__(name)
        if name not in QUEUE_CALLS:
            return found
        spent, calls = super().__getattribute__("spent"), super().__getattribute__("calls")

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return found(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
                calls[name] += 1

        return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=32)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, serve(f"sqlite:///{tmp}/daemon.db", 1) as url:
        client = TimedClient(url, token=TOKEN)
        client.spent, client.calls = defaultdict(float), defaultdict(int)
        for kernel in KERNELS:
            for backend in ("tvm", "inductor"):
                problem = dict(get_workload(kernel).demo_problem)
                client.create_job(key_for(kernel, backend, problem, "float32"))
        started = time.perf_counter()
        daemon = Daemon(client, DaemonOptions(once=True, trials=args.trials))
        completed = daemon.run()
        seconds = time.perf_counter() - started
        client.close()
    queue = sum(client.spent.values())
    rows = [[name, str(client.calls[name]), f"{client.spent[name] * 1e3:.1f}"]
            for name in QUEUE_CALLS if client.calls[name]]  # fmt: skip
    summary = render(["keys", "failed", "seconds", "keys per hour", "queue calls ms",
                      "queue share"],
                     [[str(completed), str(len(daemon.failed)), f"{seconds:.1f}",
                       f"{completed / seconds * 3600:.0f}", f"{queue * 1e3:.0f}",
                       f"{queue / seconds:.2%}"]])  # fmt: skip
    table = summary + "\n\n" + render(["queue call", "calls", "total ms"], rows)
    print(table)
    write_result(
        "daemon_throughput",
        "One CPU daemon on the demo's keys: throughput and queue overhead",
        [
            "server and daemon on the same machine; SQLite; one daemon, one harness for all jobs",
            f"the demo's 8 keys (4 kernels x TVM, Inductor at their demo problems), "
            f"{args.trials} trials each; queue share = time in claim, heartbeat, upload and "
            "complete over the whole run (the rest is tuning)",
        ],
        table,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
