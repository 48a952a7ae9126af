"""``tunecache workloads``: what can be tuned."""

from __future__ import annotations

import argparse
from typing import Any

from tunecache.cli.table import render


def register(commands: Any) -> None:
    parser = commands.add_parser("workloads", help="list workloads, shape parameters, backends")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from workloads import WORKLOADS

    rows = [
        [
            w.name,
            ",".join(w.params),
            " ".join(f"{b}({','.join(w.dtypes(b))})" for b in w.backends),
            w.description,
        ]
        for w in WORKLOADS.values()
    ]
    print(render(["workload", "shape", "backends (dtypes)", "computes"], rows))
    return 0
