"""``tunecache workloads``: what can be tuned."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tunecache_cli.table import render


def register(commands: Any) -> None:
    parser = commands.add_parser("workloads", help="list workloads, shape parameters, backends")
    parser.add_argument("--json", action="store_true", help="print them as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from workloads import WORKLOADS

    if args.json:
        listed = [{"name": w.name, "params": list(w.params), "description": w.description,
                   "backends": {b: list(w.dtypes(b)) for b in w.backends}}
                  for w in WORKLOADS.values()]  # fmt: skip
        print(json.dumps(listed, indent=2))
        return 0
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
