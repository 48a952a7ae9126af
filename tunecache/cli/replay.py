"""``tunecache replay``: run search strategies offline against a recorded landscape."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tunecache.cli.table import ms, render


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "replay", help="run strategies against a landscape file (a simulated device)"
    )
    parser.add_argument(
        "landscape", type=Path, help="a file written by `tunecache tune --landscape`"
    )
    parser.add_argument("--strategy", default="exhaustive,random,optuna",
                        help="comma-separated strategies (default: all)")  # fmt: skip
    parser.add_argument("--trials", type=int, default=50, help="evaluations per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from backends import Budget
    from tuner.landscape import Landscape
    from tuner.search import get_strategy, run_search

    landscape = Landscape.load(args.landscape)
    optimum = landscape.optimum()
    space = landscape.search_space()
    rows = []
    for name in args.strategy.split(","):
        strategy = get_strategy(name.strip(), space, seed=args.seed)
        log = run_search(strategy, landscape.evaluator(), Budget(trials=args.trials))
        best = log.best_ms
        ratio = f"{optimum.time_ms / best:.3f}" if best and optimum.time_ms else "-"
        rows.append([strategy.name, len(log), ms(best), ms(optimum.time_ms), ratio])
    print(f"{args.landscape}: {len(landscape.entries)} configs on {landscape.device}")
    print(render(["strategy", "evaluated", "best ms", "optimum ms", "optimum/best"], rows))
    return 0
