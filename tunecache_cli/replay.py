"""``tunecache replay``: run search strategies offline against a recorded landscape."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tunecache_cli.args import MAX_SEED, check_count, check_trials
from tunecache_cli.table import ms, render


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "replay", help="run strategies against a landscape file (a simulated device)"
    )
    parser.add_argument(
        "landscape", type=Path, help="a file written by `tunecache tune --landscape`"
    )
    parser.add_argument("--strategy", default="exhaustive,random,optuna,bayes,portfolio",
                        help="comma-separated strategies (default: all)")  # fmt: skip
    parser.add_argument("--trials", type=int, default=50, help="evaluations per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from backends import Budget
    from tuner.landscape import Landscape
    from tuner.search import get_strategy, run_search

    check_trials("--trials", args.trials)
    check_count("--seed", args.seed, 0, MAX_SEED)
    landscape = Landscape.load(args.landscape)
    optimum = landscape.optimum()
    space = landscape.search_space()
    rows, results = [], []
    for name in args.strategy.split(","):
        strategy = get_strategy(name.strip(), space, seed=args.seed)
        log = run_search(strategy, landscape.evaluator(), Budget(trials=args.trials))
        best = log.best_ms
        fraction = optimum.time_ms / best if best and optimum.time_ms else None
        rows.append([strategy.name, len(log), ms(best), ms(optimum.time_ms),
                     "-" if fraction is None else f"{fraction:.3f}"])  # fmt: skip
        results.append({"strategy": strategy.name, "evaluated": len(log), "best_ms": best,
                        "optimum_ms": optimum.time_ms, "optimum_over_best": fraction})  # fmt: skip
    if args.json:
        print(json.dumps({"landscape": str(args.landscape), "configs": len(landscape.entries),
                          "device": landscape.device, "results": results}, indent=2))  # fmt: skip
        return 0
    print(f"{args.landscape}: {len(landscape.entries)} configs on {landscape.device}")
    print(render(["strategy", "evaluated", "best ms", "optimum ms", "optimum/best"], rows))
    return 0
